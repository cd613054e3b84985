"""Numerics of the memslim activation ops against aten (shared by tests and bench).

Errors are input-gradient errors relative to |grad_out| (grad_out = 1), i.e.
|f'_memslim(x) - f'_ref(x)|. The reference is aten's autograd in float64 on
the same (rounded) input values; aten's own error at the tested dtype is
measured the same way, so a 16-bit figure can be read next to aten's.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, NamedTuple, Optional

import torch
import torch.nn.functional as F

from ._library import activation_table

M = torch.ops.memslim
# A non-monotonic kernel activation's minimum, from the runtime's own table.
_X_MIN = {k["name"]: k["x_min"] for k in activation_table()["kernels"]}


class Case(NamedTuple):
    ours: Callable
    aten: Callable
    x_min: Optional[float]  # location of the minimum for non-monotonic activations


CASES: Dict[str, Case] = {
    "gelu": Case(lambda x: M.gelu(x), lambda x: F.gelu(x), _X_MIN["gelu"]),
    "gelu_tanh": Case(
        lambda x: M.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh"), _X_MIN["gelu_tanh"]
    ),
    "silu": Case(lambda x: M.silu(x), F.silu, _X_MIN["silu"]),
    "mish": Case(lambda x: M.mish(x), F.mish, _X_MIN["mish"]),
    "hardswish": Case(lambda x: M.hardswish(x), F.hardswish, _X_MIN["hardswish"]),
    "softplus": Case(lambda x: M.softplus(x), F.softplus, None),
    "softplus_b2_t1": Case(
        lambda x: M.softplus(x, 2.0, 1.0), lambda x: F.softplus(x, beta=2.0, threshold=1.0), None
    ),
    "elu": Case(lambda x: M.elu(x), F.elu, None),
    "elu_a05_s2_i15": Case(
        lambda x: M.elu(x, 0.5, 2.0, 1.5), lambda x: torch.ops.aten.elu(x, 0.5, 2.0, 1.5), None
    ),
    "elu_neg_alpha": Case(lambda x: M.elu(x, -0.5), lambda x: torch.ops.aten.elu(x, -0.5), None),
    "celu": Case(lambda x: M.celu(x, 0.7), lambda x: F.celu(x, 0.7), None),
    "selu": Case(lambda x: M.selu(x), F.selu, None),
    "leaky_relu": Case(lambda x: M.leaky_relu(x), F.leaky_relu, None),
    "leaky_relu_0.2": Case(lambda x: M.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2), None),
    "hardsigmoid": Case(lambda x: M.hardsigmoid(x), F.hardsigmoid, None),
    "sigmoid": Case(lambda x: M.sigmoid(x), torch.sigmoid, None),
    "tanh": Case(lambda x: M.tanh(x), torch.tanh, None),
    "relu": Case(lambda x: M.relu(x), F.relu, None),
}

NON_MONOTONIC = [k for k, c in CASES.items() if c.x_min is not None]


def input_grad(fn: Callable, x: torch.Tensor) -> torch.Tensor:
    x = x.detach().clone().requires_grad_(True)
    fn(x).backward(torch.ones_like(x))
    return x.grad


def sweep_fp32(x_min: Optional[float]) -> torch.Tensor:
    """Dense sweep of [-20, 20], random normals, and the region around the minimum."""
    g = torch.Generator().manual_seed(0)
    parts = [torch.linspace(-20, 20, 400_001), torch.randn(200_000, generator=g)]
    if x_min is not None:
        parts.append(torch.linspace(x_min - 0.05, x_min + 0.05, 200_001, dtype=torch.float64))
        parts.append(torch.linspace(x_min - 1.0, x_min + 1.0, 200_001, dtype=torch.float64))
    return torch.cat([p.float() for p in parts])


def all_values(dtype: torch.dtype, lo: float, hi: float) -> torch.Tensor:
    """Every finite value of a 16-bit dtype in [lo, hi]."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    v = bits.view(dtype)
    v = v[torch.isfinite(v.float())]
    return v[(v.float() >= lo) & (v.float() <= hi)]


def errors(name: str, x: torch.Tensor):
    """(memslim error, aten error) per element against the float64 reference."""
    c = CASES[name]
    ref = input_grad(c.aten, x.double())
    ours = input_grad(c.ours, x).double()
    theirs = input_grad(c.aten, x).double()
    return (ours - ref).abs(), (theirs - ref).abs()


def near_min_mask(name: str, x: torch.Tensor, radius: float = 0.8) -> torch.Tensor:
    c = CASES[name]
    if c.x_min is None:
        return torch.zeros_like(x, dtype=torch.bool)
    return (x.double() - c.x_min).abs() <= radius


def table_row(
    name: str, dtype: torch.dtype, device: str = "cpu", stride: int = 1
) -> Dict[str, float]:
    """Max errors over the whole test set and near the minimum, memslim vs aten, on
    `device` (bench/gpu_check.py: CUDA); `stride` > 1 takes every stride-th point of the
    fp32 sweep only."""
    c = CASES[name]
    if dtype == torch.float32:
        x = sweep_fp32(c.x_min)[::stride]
    else:  # every value, always: the 16-bit bounds are ratios of maxima over them
        x = all_values(dtype, -20.0, 20.0)
    x = x.to(device)
    ours, theirs = errors(name, x)
    near = near_min_mask(name, x)
    row = {"max_err": ours.max().item(), "aten_max_err": theirs.max().item()}
    if near.any():
        row["near_min_err"] = ours[near].max().item()
        row["aten_near_min_err"] = theirs[near].max().item()
    else:
        row["near_min_err"] = row["aten_near_min_err"] = math.nan
    return row
