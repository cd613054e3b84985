"""The TorchScript way's memory budget: the C++ planner held to measured bytes.

What: meet_script_budget, memslim.optimize's memory_budget. The planner
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
