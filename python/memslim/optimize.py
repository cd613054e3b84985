"""memslim.optimize / memslim.report: the Python front door to the passes.

optimize() scripts an nn.Module (or takes a ScriptModule; where torch.jit.script fails, as
on memcnn's `forward(self, *xin)`, it traces the module on `example_inputs` instead and
says so in a note), clones it so the
optimized graphs are its own, and runs a pipeline on its method graphs ahead of
time (the executor's own pass hooks run too late for training, see README).
Shapes for the cost model come from `example_inputs`; without them every site
is kept with the remark "unknown shape".
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable, List, Optional, Sequence

import torch

from . import _C
from . import records
from ._policy import policy_keywords
from .budget import meet_script_budget, meet_script_peak
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
    peak_memory=None,
    optimizer=None,
    policy: dict,
):
    """Returns an optimized ScriptModule (savable with torch.jit.save).

    model: nn.Module (scripted here; where torch.jit.script fails, traced with
    torch.jit.trace on example_inputs, and a note in memslim.report says why: the trace
    specialises control flow to those inputs) or ScriptModule. example_inputs: forward's
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
    peak_memory: the training step's peak tensor memory instead (bytes, or a size such
    as "6GB"), with `optimizer`'s state counted where given: the step on example_inputs
    is measured and the saved bytes planned into what the rest leaves
    (budget.meet_script_peak); needs example_inputs.
    """
    if peak_memory is not None:
        from .budget.model import parse_bytes

        if policy["memory_budget"] is not None:
            raise ValueError(
                "memslim.optimize: give memory_budget (saved bytes) or peak_memory (the "
                "step's peak), not both"
            )
        peak_memory = parse_bytes(peak_memory, "memslim.optimize")
        if example_inputs is None:
            raise ValueError(
                "memslim.optimize: peak_memory needs example_inputs (the step is measured)"
            )
    elif optimizer is not None:
        raise ValueError("memslim.optimize: optimizer= is read only with peak_memory=")
    args, kwargs = _split_example_inputs(example_inputs)
    if not isinstance(pipeline, str):
        raise ValueError(f"memslim.optimize: pipeline must be a string, got {pipeline!r}")
    pass_list = _str_list("passes", passes or ())
    method_list = _str_list("methods", methods)
    front: List[Decision] = []
    if isinstance(model, torch.jit.ScriptModule):
        scripted = model
    else:
        scripted, front = _script_or_trace(model, args, kwargs)
    if not hasattr(scripted, "_c"):
        raise TypeError(
            "memslim.optimize: expected an nn.Module or a scripted module, "
            f"got {type(model).__name__}"
        )

    def run(p):
        return _run(scripted, method_list, pass_list, pipeline, args, kwargs, p)

    notes: List[Decision] = []
    if peak_memory is not None:
        if "forward" not in method_list:
            raise ValueError(
                "memslim.optimize: peak_memory plans the forward: methods must name it"
            )
        # The step's peak, held to measure (budget.torchscript.meet_script_peak).
        optimized, notes = meet_script_peak(
            model, scripted, run, args, kwargs, policy, peak_memory, optimizer
        )
    elif policy["memory_budget"] is not None and (args or kwargs) and "forward" in method_list:
        # The budget planner's TorchScript way (budget.torchscript), held to measured bytes.
        optimized, notes = meet_script_budget(model, scripted, run, args, kwargs, policy)
    else:
        optimized = run(policy)
    records.lookup(optimized).last()[:0] = front
    records.lookup(optimized).last().extend(notes)
    return optimized


def _script_or_trace(model, args, kwargs):
    """(ScriptModule, notes): torch.jit.script(model), or where that fails, torch.jit.trace
    on the example inputs, with a note saying why and what a trace gives up. The trace's
    forward run leaves the module's state (BatchNorm's running stats) and the global RNG
    as they were, like optimize's own recording run."""
    if not isinstance(model, torch.nn.Module):
        return torch.jit.script(model), []
    try:
        return torch.jit.script(model), []
    except Exception as e:  # the frontend's NotSupportedError, the compiler's RuntimeError...
        failure = e
    why = f"{type(failure).__name__}: " + (str(failure).strip().splitlines() or [""])[0].rstrip(":")
    if not (args or kwargs):
        raise RuntimeError(
            "memslim.optimize: torch.jit.script cannot compile this module "
            f"({why}); pass example_inputs and memslim.optimize traces it with "
            "torch.jit.trace instead"
        ) from failure
    state = list(model.parameters()) + list(model.buffers())
    saved = [t.detach().clone() for t in state]
    devices = sorted({t.device.index or 0 for t in state if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(
            model,
            example_inputs=args if args else None,
            example_kwarg_inputs=kwargs if kwargs else None,
            check_trace=False,
        )
    with torch.no_grad():
        for t, s in zip(state, saved):
            t.copy_(s)
    text = (
        f"torch.jit.script failed ({why}); traced with torch.jit.trace on example_inputs "
        "instead: the traced graph specialises control flow (Python branches and loops as "
        "these inputs took them, Python values as constants) to these inputs"
    )
    return traced, [records.note("memslim.optimize", text)]


def _run(scripted, method_list, pass_list, pipeline, args, kwargs, policy):
    cpp, remarks = _C.optimize(scripted._c, method_list, pass_list, pipeline, args, kwargs, policy)
    optimized = torch.jit._recursive.wrap_cpp_module(cpp)
    records.remember(optimized, [Decision(r) for r in remarks], "memslim.optimize (TorchScript)")
    return optimized
