"""memslim.optimize / memslim.report: the Python front door to the passes.

optimize() scripts an nn.Module (or takes a ScriptModule), clones it so the
optimized graphs are its own, and runs a pipeline on its method graphs ahead of
time (the executor's own pass hooks run too late for training, see README).
Shapes for the cost model come from `example_inputs`; without them every site
is kept with the remark "unknown shape".
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence

import torch

from . import _C
from ._policy import policy_keywords
from . import records
from .records import Decision


def _str_list(name: str, values) -> List[str]:
    if isinstance(values, str):
        values = [values] if name == "methods" else values.split(",")
    out = list(values)
    if not all(isinstance(v, str) for v in out):
        raise ValueError(f"memslim.optimize: {name} must be strings, got {out!r}")
    return out


def _split_example_inputs(example_inputs):
    """(positional tuple, keyword dict) from what the user passed."""
    if example_inputs is None:
        return (), {}
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise TypeError(
        "memslim.optimize: example_inputs must be a tuple or list of forward's arguments "
        "(tensors, bools, ints, floats, None, strings, tuples/lists/dicts of them), a "
        f"Tensor, or a dict of keyword arguments; got {type(example_inputs).__name__}"
    )


@policy_keywords("memslim.optimize")
def optimize(
    model,
    example_inputs: Optional[Any] = None,
    *,
    passes: Optional[Iterable[str]] = None,
    pipeline: str = "memslim-default",
    methods: Sequence[str] = ("forward",),
    policy: dict,
):
    """Returns an optimized ScriptModule (savable with torch.jit.save).

    model: nn.Module (scripted here) or ScriptModule. example_inputs: forward's
    arguments for one recording run (shapes and dtypes only; the module's state and
    the global RNG are left as they were): a tuple or list of positional values
    (tensors, bools, ints, floats, None, strings, tuples/lists/dicts of tensors: what
    TorchScript takes), a single Tensor, or a dict of keyword arguments. Arguments
    with defaults need no value. passes: explicit pass flags instead of `pipeline`.
    The policy keywords (listed below, from the C++ table; ValueError when out of
    range) are every entry point's. memory_budget here: keep at most this fraction (in (0, 1]) of what the unmodified model
    keeps for backward (measured on example_inputs: eager for an nn.Module, the
    ScriptModule as given), or this many bytes (> 1); needs example_inputs. Nothing is
    rewritten when the model already meets it; else the pipeline, then whole blocks
    recomputed in backward (passes/memory_budget.cpp), and the result is measured: a
    plan over the target is redone tighter. RuntimeError when it cannot be met,
    naming the smallest reachable figure; memslim.report() says what was chosen.
    """
    args, kwargs = _split_example_inputs(example_inputs)
    if not isinstance(pipeline, str):
        raise ValueError(f"memslim.optimize: pipeline must be a string, got {pipeline!r}")
    pass_list = _str_list("passes", passes or ())
    method_list = _str_list("methods", methods)
    scripted = model if isinstance(model, torch.jit.ScriptModule) else torch.jit.script(model)
    if not hasattr(scripted, "_c"):
        raise TypeError(
            "memslim.optimize: expected an nn.Module or a scripted module, "
            f"got {type(model).__name__}"
        )
    if policy["memory_budget"] is not None and (args or kwargs) and "forward" in method_list:
        return _optimize_to_measured_budget(
            model, scripted, method_list, pass_list, pipeline, args, kwargs, policy
        )
    return _run(scripted, method_list, pass_list, pipeline, args, kwargs, policy)


def _run(scripted, method_list, pass_list, pipeline, args, kwargs, policy):
    cpp, remarks = _C.optimize(scripted._c, method_list, pass_list, pipeline, args, kwargs, policy)
    optimized = torch.jit._recursive.wrap_cpp_module(cpp)
    records.remember(optimized, [Decision(r) for r in remarks])
    return optimized


def _add_budget_notes(optimized, texts) -> None:
    """memory-budget notes made here (the measurements) after the passes' records."""
    records.lookup(optimized).extend(
        Decision(
            {
                "pass": "memory-budget",
                "verdict": "note",
                "site": "",
                "text": t,
                "bytes_before": None,
                "bytes_after": None,
                "added_work": None,
                "line": f"remark: memory-budget: {t}",
            }
        )
        for t in texts
    )


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _planner_only(scripted, method_list, pass_list, pipeline, args, kwargs, policy, why):
    optimized = _run(scripted, method_list, pass_list, pipeline, args, kwargs, policy)
    _add_budget_notes(optimized, [why])
    return optimized


# How many plans optimize() tries before it calls a budget unmet by measurement.
_BUDGET_ATTEMPTS = 4


def _optimize_to_measured_budget(
    model, scripted, method_list, pass_list, pipeline, args, kwargs, policy
):
    """memory_budget held to measured bytes, not only to the planner's model.

    The planner (passes/memory_budget.cpp) prices the graph with a static model of
    what autograd keeps, which can be off by some percent either way (llama_small:
    it predicted 66.1 MB where the traced module keeps 60.7 MB). Here the budget is
    measured: the reference is what the module the user passed keeps (eager for an
    nn.Module, the ScriptModule as given), the target floor(budget * reference) or
    the budget in bytes, and the planner is asked for the fraction of its own figure
    that the measured bytes say meets it; a plan that measures over the target is
    redone with the fraction scaled by target / measured, at most _BUDGET_ATTEMPTS
    plans in all. Measurements restore parameters' grads, buffers and the RNG."""
    from .measure import saved_bytes_quietly

    budget = policy["memory_budget"]
    eager = not isinstance(model, torch.jit.ScriptModule)
    what = "eager" if eager else "the given ScriptModule"
    try:
        ref = saved_bytes_quietly(model, args, kwargs)
    except Exception as e:  # the model does not train on these inputs: the planner decides
        return _planner_only(
            scripted,
            method_list,
            pass_list,
            pipeline,
            args,
            kwargs,
            policy,
            f"not measured ({what} failed a training step: {_first_line(e)})",
        )
    unmodified = ref
    if eager:
        try:
            unmodified = saved_bytes_quietly(scripted, args, kwargs)
        except Exception:  # e.g. TorchScript's autodiff refusing an in-place add: eager's figure
            pass
    target = int(budget * ref) if budget <= 1 else int(budget)
    if unmodified == 0:  # nothing kept (no grad): the planner's own figures decide
        return _planner_only(
            scripted,
            method_list,
            pass_list,
            pipeline,
            args,
            kwargs,
            policy,
            "not measured (the model keeps nothing for backward)",
        )
    notes = [
        f"measured: the unmodified model keeps {ref:,} B ({what}), the scripted one "
        f"{unmodified:,} B; target {target:,} B"
    ]
    fraction = min(1.0, target / unmodified)
    for attempt in range(1, _BUDGET_ATTEMPTS + 1):
        try:
            optimized = _run(
                scripted,
                method_list,
                pass_list,
                pipeline,
                args,
                kwargs,
                dict(policy, memory_budget=max(fraction, 1e-9)),
            )
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
            _add_budget_notes(optimized, notes)
            return optimized
        fraction *= target / kept * 0.998
    raise RuntimeError(
        f"memory_budget {budget:g} ({target:,} B of the unmodified model's {ref:,} B, measured) "
        f"not met after {_BUDGET_ATTEMPTS} plans: the last keeps {kept:,} B; " + "; ".join(notes)
    )
