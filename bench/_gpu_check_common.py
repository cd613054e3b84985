"""What bench/gpu_check.py's parts share: a result row, the plan, guarded checks.

What: `Row` (one line of the table: part, check, status, what was measured, the bound it
was held to, seconds), `check(rows, part, name, fn)` (runs one check and turns any
exception into a FAIL row, so that one broken check never hides the others), the plan
(every GPU step with its estimated seconds on an H200) and the torch-version facts the
parts read (which features need torch 2.14's internals).
Why: the GPU check runs once, on a machine lent for minutes; every part must report
rather than crash, and the dry run must list the same steps the GPU run takes.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

OK, FAIL, WARN, SKIP, INFO = "ok", "FAIL", "warn", "skip", "info"

# The GPU steps, in order, with their estimated seconds on one H200 and 16 cores (the
# build: 4.8 CPU-minutes of 27 compiles on 2 cores here against torch 2.11, ccache cold,
# the longest single compile 63 s, so about 1.5 min on 16 cores with configure and links;
# the checks: from their sizes, docs/gpu_check.md).
PLAN = [
    ("build", "runtime library (CUDA kernels, sm_90) + memslim._C, no gtest", 120),
    ("1 ops", "every op's CUDA path vs aten: numerics, edge inputs, layouts, bytes", 40),
    ("2 opcheck", "torch.library.opcheck on the CUDA ops", 25),
    ("3 speed", "fwd+bwd vs aten, 16M elements, CUDA events, median of 20", 20),
    ("4 models", "3 models x 4 ways: peak, saved bytes, time, gradients", 150),
]


@dataclass
class Row:
    part: str
    name: str
    status: str
    value: str = ""
    bound: str = ""
    secs: Optional[float] = None


def torch_version() -> tuple:
    """(major, minor) of the running torch."""
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def first_line(e: BaseException) -> str:
    while getattr(e, "inner_exception", None) is not None:  # Dynamo's BackendCompilerFailed
        e = e.inner_exception
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:160]


def check(rows: List[Row], part: str, name: str, fn: Callable[[], tuple], verbose=False):
    """Runs fn() -> (status, value, bound) and appends its row; an exception is a FAIL
    row with its first line (the traceback too with verbose)."""
    t0 = time.perf_counter()
    if name in os.environ.get("GPU_CHECK_SKIP", "").split(","):  # one that breaks the context
        rows.append(Row(part, name, SKIP, "GPU_CHECK_SKIP", "", 0.0))
        return rows[-1]
    try:
        status, value, bound = fn()
    except Exception as e:  # noqa: BLE001  (one check failing must not hide the others)
        if verbose:
            traceback.print_exc()
        status, value, bound = FAIL, first_line(e), ""
    rows.append(Row(part, name, status, value, bound, time.perf_counter() - t0))
    return rows[-1]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fmt(x: float) -> str:
    return f"{x:.2e}" if x and (abs(x) < 1e-2 or abs(x) >= 1e4) else f"{x:.3g}"


def verdict(ok: bool) -> str:
    return OK if ok else FAIL
