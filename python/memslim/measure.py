"""Saved-for-backward measurement with torch.autograd.graph.saved_tensors_hooks.

The figure memslim is judged by: distinct storage bytes that autograd keeps for
backward during one training forward, parameters excluded. A scripted module's
first calls run a profiling plan that saves other tensors than later calls, so
the measurement follows `warmup` full training steps (forward + backward) whose
parameter gradients and buffers are restored afterwards.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterable

import torch


def _storage_key(t: torch.Tensor):
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return (t.device.type, t.device.index, st.data_ptr(), st.nbytes())


def _params_of(model) -> Iterable[torch.Tensor]:
    if isinstance(model, torch.nn.Module):
        return list(model.parameters())
    return []


def _accumulated_leaves(tensors) -> list:
    """The leaf tensors a backward from `tensors` accumulates gradients into (the
    AccumulateGrad nodes' variables of their graph)."""
    seen, leaves, stack = set(), [], [t.grad_fn for t in tensors]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if isinstance(var, torch.Tensor):
            leaves.append(var)
        stack.extend(f for f, _ in fn.next_functions)
    return leaves


def backward_leaving_no_grads(*tensors) -> None:
    """torch.autograd.backward(tensors), every leaf's .grad put back as it was after it: a
    measuring step's loss is not the user's, and what it accumulates must not reach the
    user's step (an input that requires grad came out of memslim.compile(peak_memory=)'s
    first step with 716x eager's gradient, 2026-11-30; parameters, inputs and tensors
    the model closes over alike). What the backward allocates is allocated as in a step."""
    held = [(v, v.grad) for v in _accumulated_leaves(tensors)]
    for v, _ in held:
        v.grad = None
    try:
        torch.autograd.backward(list(tensors))
    finally:
        for v, g in held:
            v.grad = g


def _run_backward(out) -> None:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    tensors = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if tensors:
        backward_leaving_no_grads(*[o.float().sum() for o in tensors])


class _SavedRecorder:
    def __init__(self, exclude: Iterable[torch.Tensor]):
        self.exclude = {_storage_key(p) for p in exclude}
        self.storages: Dict[tuple, int] = {}

    def pack(self, t: torch.Tensor):
        key = _storage_key(t)
        if key is not None and key not in self.exclude and key not in self.storages:
            self.storages[key] = key[3]
        return t

    @staticmethod
    def unpack(t):
        return t


@contextlib.contextmanager
def _state_kept(model):
    """The model's parameters' gradients and its buffers as they were after the block
    (measuring steps train; the user's module must not see them)."""
    params = _params_of(model)
    saved_grads = [p.grad for p in params]
    buffers = []
    if isinstance(model, torch.nn.Module):
        buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield params
    finally:
        for p, g in zip(params, saved_grads):
            p.grad = g
        with torch.no_grad():
            for b, v in buffers:
                b.copy_(v)


def _measure(model: Callable, inputs, warmup: int, kwargs=None):
    kwargs = kwargs or {}
    with _state_kept(model) as params:
        for _ in range(warmup):
            _run_backward(model(*inputs, **kwargs))
        rec = _SavedRecorder(params)
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
            out = model(*inputs, **kwargs)
        del out
        return rec


def saved_bytes(model: Callable, *inputs, warmup: int = 2) -> int:
    """Distinct storage bytes autograd saves in one training forward of model(*inputs).

    Parameters' storages are excluded; each storage counts once however many
    saved tensors view it. `warmup` training steps run first (their gradients
    and buffer updates are undone).
    """
    return sum(_measure(model, inputs, warmup).storages.values())


def saved_bytes_quietly(model: Callable, args, kwargs, warmup: int = 2) -> int:
    """saved_bytes(model, *args, **kwargs) that also leaves the global RNG (CPU and
    the inputs' CUDA devices) as it was: memslim.optimize measures with it."""
    devices = sorted({t.device.index or 0 for t in _tensors(args, kwargs) if t.is_cuda})
    with torch.random.fork_rng(devices=devices):
        return sum(_measure(model, args, warmup, kwargs).storages.values())


def _tensors(args, kwargs):
    stack = list(args) + list(kwargs.values())
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
