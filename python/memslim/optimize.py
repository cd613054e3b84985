"""memslim.optimize / memslim.report: the Python front door to the passes.

optimize() scripts an nn.Module (or takes a ScriptModule), clones it so the
optimized graphs are its own, and runs a pipeline on its method graphs ahead of
time (the executor's own pass hooks run too late for training, see README).
Shapes for the cost model come from `example_inputs`; without them every site
is kept with the remark "unknown shape".
"""

from __future__ import annotations

import numbers
import weakref
from typing import Any, Iterable, List, Optional, Sequence

import torch

from . import _C
from .budget import meet_script_budget
from .records import Decision


_REPORTS: "weakref.WeakKeyDictionary[torch.jit.ScriptModule, List[Decision]]" = (
    weakref.WeakKeyDictionary()
)


def _policy(**values) -> dict:
    """The policy keywords as the C++ table (passes/policy.cpp) checks them, which
    raises ValueError naming the keyword and what it expects. numbers.Integral /
    numbers.Real (numpy scalars) become int / float; bools stay bools (refused)."""
    out = {}
    for name, v in values.items():
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            v = int(v)
        elif isinstance(v, numbers.Real) and not isinstance(v, bool):
            v = float(v)
        out[name] = v
    _C.check_policy(out)
    return out


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


def optimize(
    model,
    example_inputs: Optional[Any] = None,
    *,
    passes: Optional[Iterable[str]] = None,
    pipeline: str = "memslim-default",
    methods: Sequence[str] = ("forward",),
    min_bytes: int = 1,
    max_added_work: Optional[float] = None,
    assume_numel: int = 0,
    dropout_mask_bytes: Optional[int] = None,
    coupling_anchor_every: int = 8,
    coupling_drift_bound: float = 1e-5,
    memory_budget: Optional[float] = None,
):
    """Returns an optimized ScriptModule (savable with torch.jit.save).

    model: nn.Module (scripted here) or ScriptModule. example_inputs: forward's
    arguments for one recording run (shapes and dtypes only; the module's state and
    the global RNG are left as they were): a tuple or list of positional values
    (tensors, bools, ints, floats, None, strings, tuples/lists/dicts of tensors: what
    TorchScript takes), a single Tensor, or a dict of keyword arguments. Arguments
    with defaults need no value. passes: explicit pass flags instead of `pipeline`.
    Policy (ValueError when out of range): min_bytes, the least a rewrite must free
    (integer >= 0); max_added_work, the most extra work a rewrite may add, in
    activation evaluations per element (inverting GELU/SiLU ~2, Mish ~1, the rest
    <= 0.5; >= 0, None: no bound); assume_numel, price sites of unknown shape as if
    they had this many fp32 elements instead of keeping them (integer in [0, 2**40]);
    dropout_mask_bytes, what aten's dropout keeps per element (0 or 1; None: 1, the
    bool mask, when torch.jit's executor optimises, as it does by default; else the
    float noise); coupling_anchor_every, in a chain of couplings every k-th block keeps
    its exact input (0: none); coupling_drift_bound, a coupling block whose input,
    rebuilt from its outputs on the first training call, is off by more than this
    (relative, max norm) keeps its exact input from then on (in (0, 1]).
    memory_budget: keep at most this fraction (in (0, 1]) of what the unmodified model
    keeps for backward (measured on example_inputs: eager for an nn.Module, the
    ScriptModule as given), or this many bytes (> 1); needs example_inputs. Nothing is
    rewritten when the model already meets it; else the pipeline, then whole blocks
    recomputed in backward (passes/jit/memory_budget.cpp), and the result is measured: a
    plan over the target is redone tighter (memslim.budget). RuntimeError when it cannot be met,
    naming the smallest reachable figure; memslim.report() says what was chosen.
    """
    policy = _policy(
        min_bytes=min_bytes,
        max_added_work=max_added_work,
        assume_numel=assume_numel,
        dropout_mask_bytes=dropout_mask_bytes,
        coupling_anchor_every=coupling_anchor_every,
        coupling_drift_bound=coupling_drift_bound,
        memory_budget=memory_budget,
    )
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
    if memory_budget is not None and (args or kwargs) and "forward" in method_list:
        # The budget planner's TorchScript way (budget.torchscript), held to measured bytes.
        optimized, notes = meet_script_budget(
            model,
            scripted,
            lambda p: _run(scripted, method_list, pass_list, pipeline, args, kwargs, p),
            args,
            kwargs,
            policy,
        )
        _REPORTS[optimized] += notes
        return optimized
    return _run(scripted, method_list, pass_list, pipeline, args, kwargs, policy)


def _run(scripted, method_list, pass_list, pipeline, args, kwargs, policy):
    cpp, remarks = _C.optimize(scripted._c, method_list, pass_list, pipeline, args, kwargs, policy)
    optimized = torch.jit._recursive.wrap_cpp_module(cpp)
    _REPORTS[optimized] = [Decision(r) for r in remarks]
    return optimized


def report(optimized) -> List[Decision]:
    """The decision records of the optimize() call that produced `optimized`, one per
    site, in order. Each is a `Decision`: as a str, the remark line
    `remark: <pass>: rewrote|kept <op> at %v: <reason, bytes>`."""
    try:
        return list(_REPORTS[optimized])
    except KeyError:
        raise ValueError(
            "memslim.report: this module was not produced by memslim.optimize"
        ) from None
