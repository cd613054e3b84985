"""The TorchScript way's memory budget: the C++ planner held to measured bytes.

What: meet_script_budget, memslim.optimize's memory_budget, and meet_script_peak, its
peak_memory (the step's measured peak turned into a saved-bytes budget). The planner
(passes/jit/memory_budget.cpp over the core's ladder) prices a graph with a static model of
what autograd keeps; here the reference and each plan are measured (memslim.measure's
saved_tensors_hooks), and the planner is asked again, tighter, while a plan measures over
the target.
Why its own module: the budget's second way in; it shares the target, the notes and the
entry with the compile way (budget/__init__), not its algorithm (no partition dry runs
outside torch.compile).
"""

from __future__ import annotations

from typing import Callable, List, Tuple

import torch

from . import budget_note, target_bytes
from ..records import Decision

# How many plans optimize() tries before it calls a budget unmet by measurement.
_BUDGET_ATTEMPTS = 4


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def meet_script_budget(
    model, scripted, run: Callable[[dict], object], args, kwargs, policy: dict
) -> Tuple[object, List[Decision]]:
    """memory_budget held to measured bytes, not only to the planner's model.

    The planner (passes/jit/memory_budget.cpp) prices the graph with a static model of
    what autograd keeps, which can be off by some percent either way (llama_small:
    it predicted 66.1 MB where the traced module keeps 60.7 MB). Here the budget is
    measured: the reference is what the module the user passed keeps (eager for an
    nn.Module, the ScriptModule as given), the target floor(budget * reference) or
    the budget in bytes, and the planner is asked for the fraction of its own figure
    that the measured bytes say meets it; a plan that measures over the target is
    redone with the fraction scaled by target / measured, at most _BUDGET_ATTEMPTS
    plans in all. Measurements restore parameters' grads, buffers and the RNG.
    `run(policy)`: the pipeline on `scripted` with that policy (memslim.optimize's).
    Returns the optimized module and the memory-budget notes to add after its records."""
    from ..measure import saved_bytes_quietly

    budget = policy["memory_budget"]
    eager = not isinstance(model, torch.jit.ScriptModule)
    what = "eager" if eager else "the given ScriptModule"
    try:
        ref = saved_bytes_quietly(model, args, kwargs)
    except Exception as e:  # the model does not train on these inputs: the planner decides
        why = f"not measured ({what} failed a training step: {_first_line(e)})"
        return run(policy), [budget_note(why)]
    unmodified = ref
    if eager:
        try:
            unmodified = saved_bytes_quietly(scripted, args, kwargs)
        except Exception:  # e.g. TorchScript's autodiff refusing an in-place add: eager's figure
            pass
    target = target_bytes(budget, ref)
    if unmodified == 0:  # nothing kept (no grad): the planner's own figures decide
        return run(policy), [budget_note("not measured (the model keeps nothing for backward)")]
    notes = [
        f"measured: the unmodified model keeps {ref:,} B ({what}), the scripted one "
        f"{unmodified:,} B; target {target:,} B"
    ]
    fraction = min(1.0, target / unmodified)
    for attempt in range(1, _BUDGET_ATTEMPTS + 1):
        try:
            optimized = run(dict(policy, memory_budget=max(fraction, 1e-9)))
        except RuntimeError as e:
            raise RuntimeError(
                f"memory_budget {budget:g} ({target:,} B measured against the unmodified "
                f"model's {ref:,} B; the planner was asked for {fraction:.4g} of its own "
                f"figure): {e}"
            ) from None
        kept = saved_bytes_quietly(optimized, args, kwargs)
        notes.append(
            f"plan {attempt}: planner fraction {fraction:.4g} -> measured {kept:,} B "
            f"({kept / ref:.3f} of the unmodified)"
        )
        if kept <= target:
            return optimized, [budget_note(t) for t in notes]
        fraction *= target / kept * 0.998
    raise RuntimeError(
        f"memory_budget {budget:g} ({target:,} B of the unmodified model's {ref:,} B, measured) "
        f"not met after {_BUDGET_ATTEMPTS} plans: the last keeps {kept:,} B; " + "; ".join(notes)
    )


def _step_peak(module, args, kwargs, resident: int, warmup: int = 2):
    """The peak of one training step of `module` (after `warmup` steps: a ScriptModule's
    first calls run a profiling plan), measured as budget.model measures memslim.compile's
    verifying step; gradients, buffers and the RNG put back as they were."""
    from ..measure import _run_backward, _state_kept, _tensors
    from .model import _measure_step

    devices = sorted({t.device.index or 0 for t in _tensors(args, kwargs) if t.is_cuda})
    with _state_kept(module) as params, torch.random.fork_rng(devices=devices):
        for _ in range(warmup):
            _run_backward(module(*args, **kwargs))
        for p in params:
            p.grad = None
        return _measure_step(module, args, kwargs, resident)


def meet_script_peak(
    model, scripted, run: Callable[[dict], object], args, kwargs, policy: dict, peak, optimizer
) -> Tuple[object, List[Decision]]:
    """memslim.optimize's peak_memory: the training step's peak held to a measure.

    The step on example_inputs is measured unmodified (the scripted module: its saved
    bytes and its peak), what no plan changes counted (parameters, buffers, inputs,
    gradients, the optimizer's state: budget.model.StepPeak), and the rest of the peak
    beyond the saved bytes taken as the step's working memory. The saved bytes that
    leave the peak at the limit are then the memory budget (meet_script_budget, in
    bytes); the plan's step is measured, and where it peaks over the limit the budget
    is lowered by the excess, at most _BUDGET_ATTEMPTS plans in all. RuntimeError
    where no plan meets it, naming the smallest peak measured. Returns the optimized
    module and the notes."""
    from ..measure import saved_bytes_quietly
    from .model import StepPeak

    step = StepPeak(peak, optimizer)
    step.begin(model, args, kwargs)
    resident = step.resident or 0
    top = _step_peak(scripted, args, kwargs, resident)
    if top is None:
        return run(dict(policy, memory_budget=None)), [
            budget_note("peak_memory not measured: the model's outputs need no gradients")
        ]
    saved = saved_bytes_quietly(scripted, args, kwargs)
    working = top - resident - saved
    head = (
        f"peak_memory {step.limit:,} B: the unmodified step peaks at {top:,} B "
        f"({', '.join(f'{k} {v:,} B' for k, v in step.parts.items() if v)}; saved for "
        f"backward {saved:,} B, working memory {working:,} B)"
    )
    if top <= step.limit:
        optimized = run(dict(policy, memory_budget=None))
        return optimized, [budget_note(head + ": met as it is", top, top)]
    notes = [budget_note(head)]
    target = step.limit - resident - working
    best = top
    for attempt in range(1, _BUDGET_ATTEMPTS + 1):
        if target <= 1:
            break
        try:
            optimized, budget_notes = meet_script_budget(
                model, scripted, run, args, kwargs, dict(policy, memory_budget=float(target))
            )
        except RuntimeError as e:
            notes.append(budget_note(f"plan {attempt}: saved bytes {target:,} B: {_first_line(e)}"))
            break
        got = _step_peak(optimized, args, kwargs, resident)
        got = top if got is None else got
        best = min(best, got)
        notes.extend(budget_notes)
        notes.append(
            budget_note(
                f"plan {attempt}: saved bytes at most {target:,} B -> measured step peak {got:,} B",
                top,
                got,
            )
        )
        if got <= step.limit:
            notes.append(budget_note(f"{head}: met, measured {got:,} B", top, got))
            return optimized, notes
        target -= got - step.limit
    raise RuntimeError(
        f"peak_memory {step.limit:,} B for the training step cannot be met: the smallest "
        f"peak measured is {best:,} B (the unmodified step's {top:,} B; parameters, buffers, "
        f"inputs and optimizer state {resident:,} B); " + "; ".join(d.text for d in notes[1:])
    )
