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
from . import records
from ._policy import policy_keywords
from .budget import meet_script_budget
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
    recomputed in backward (passes/jit/memory_budget.cpp), and the result is measured: a
    plan over the target is redone tighter (memslim.budget). RuntimeError when it cannot be met,
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
        # The budget planner's TorchScript way (budget.torchscript), held to measured bytes.
        optimized, notes = meet_script_budget(
            model,
            scripted,
            lambda p: _run(scripted, method_list, pass_list, pipeline, args, kwargs, p),
            args,
            kwargs,
            policy,
        )
        records.lookup(optimized).last().extend(notes)
        return optimized
    return _run(scripted, method_list, pass_list, pipeline, args, kwargs, policy)


def _run(scripted, method_list, pass_list, pipeline, args, kwargs, policy):
    cpp, remarks = _C.optimize(scripted._c, method_list, pass_list, pipeline, args, kwargs, policy)
    optimized = torch.jit._recursive.wrap_cpp_module(cpp)
    records.remember(optimized, [Decision(r) for r in remarks], "memslim.optimize (TorchScript)")
    return optimized
