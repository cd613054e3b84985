"""memslim.optimize / memslim.report: the Python front door to the passes.

optimize() scripts an nn.Module (or takes a ScriptModule), clones it so the
optimized graphs are its own, and runs a pipeline on its method graphs ahead of
time (the executor's own pass hooks run too late for training, see README).
Shapes for the cost model come from `example_inputs`; without them every site
is kept with the remark "unknown shape".
"""
from __future__ import annotations

import re
import weakref
from typing import Iterable, List, Optional, Sequence

import torch

from . import _C

_REPORTS: "weakref.WeakKeyDictionary[torch.jit.ScriptModule, List[str]]" = weakref.WeakKeyDictionary()


def optimize(model, example_inputs: Optional[Sequence[torch.Tensor]] = None, *,
             passes: Optional[Iterable[str]] = None, pipeline: str = "memslim-default",
             methods: Sequence[str] = ("forward",), min_bytes: int = 1,
             max_added_work: Optional[float] = None, assume_numel: int = 0,
             dropout_mask_bytes: Optional[int] = None):
    """Returns an optimized ScriptModule (savable with torch.jit.save).

    model: nn.Module (scripted here) or ScriptModule. example_inputs: tensors for
    forward, used only for their shapes and dtypes. passes: explicit pass flags
    instead of `pipeline`. Policy: min_bytes, the least a rewrite must free;
    max_added_work, the most extra work a rewrite may add, in activation
    evaluations per element (inverting GELU/SiLU ~2, Mish ~1, the rest <= 0.5);
    assume_numel, price sites of unknown shape as if they had this many fp32
    elements instead of keeping them; dropout_mask_bytes, what aten's dropout keeps
    per element (None: 1, the bool mask, when torch.jit's executor optimises, as
    it does by default; else the float noise).
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    scripted = model if isinstance(model, torch.jit.ScriptModule) else torch.jit.script(model)
    if not hasattr(scripted, "_c"):
        raise TypeError("memslim.optimize: expected an nn.Module or a scripted module, "
                        f"got {type(model).__name__}")
    inputs = [t.detach() for t in (example_inputs or ())]
    cpp, remarks = _C.optimize(scripted._c, list(methods), list(passes or ()), pipeline,
                               inputs, int(min_bytes),
                               -1.0 if max_added_work is None else float(max_added_work),
                               int(assume_numel),
                               -1 if dropout_mask_bytes is None else int(dropout_mask_bytes))
    optimized = torch.jit._recursive.wrap_cpp_module(cpp)
    _REPORTS[optimized] = list(remarks)
    return optimized


def predicted_bytes_freed(optimized) -> int:
    """The cost model's total: the bytes every `rewrote` remark says it frees."""
    total = 0
    for line in report(optimized):
        m = re.search(r": rewrote .*frees (-?\d+) B \(", line)
        if m:
            total += int(m.group(1))
    return total


def report(optimized) -> List[str]:
    """The remarks of the optimize() call that produced `optimized`: one line per
    site, `remark: <pass>: rewrote|kept <op> at %v: <reason, bytes>`."""
    try:
        return list(_REPORTS[optimized])
    except KeyError:
        raise ValueError("memslim.report: this module was not produced by memslim.optimize") from None
