"""bench/gpu_check.py parts 2 and 3: torch.library.opcheck on a device, and op speed.

What: part 2 runs torch.library.opcheck (schema, autograd registration, fake tensors,
the AOT dispatcher) on every public op and the internal activation_forward /
activation_backward / norm_fallback with their tensors on `device` (the calls of
test_op_opinfo.py, test_norm_ops.py, test_join_pool_ops.py, test_act_consumer_ops.py).
Part 3 times forward + backward of each activation op against aten's (16M elements,
N(0, 1), fp32 and bf16; CUDA events, aten and memslim interleaved, median of `reps`)
and sets the ratio beside the bytes ratio of bench/results/cuda_bytes.md (the floor of
a memory-bound kernel): within 1.5x of it is ok, beyond it a warning.
Why: the first GPU run must say whether the CUDA registrations trace and how far the
kernels are from their memory-bound floor.
"""

from __future__ import annotations

import statistics
from typing import List

import torch

from _gpu_check_common import INFO, OK, WARN, Row, check, sync

M = torch.ops.memslim

PUBLIC_CALLS = {  # test_op_opinfo.py's
    "gelu": ((), {}),
    "gelu_tanh": (("tanh",), {}),
    "silu": ((), {}),
    "mish": ((), {}),
    "softplus": ((2.0, 1.0), {}),
    "elu": ((0.5, 2.0, 1.5), {}),
    "celu": ((0.7,), {}),
    "selu": ((), {}),
    "leaky_relu": ((0.2,), {}),
    "hardswish": ((), {}),
    "hardsigmoid": ((), {}),
    "sigmoid": ((), {}),
    "tanh": ((), {}),
    "relu": ((), {}),
}


def _x(device, shape=(3, 5), dtype=torch.float32, grad=True):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 - 0.5).to(dtype)
    x.view(-1)[0] = -0.7517915  # inside gelu's guard band: a non-empty exact list
    x.view(-1)[1] = 0.0
    return x.to(device).requires_grad_(grad)


def _opcheck(fn):
    fn()
    return OK, "passed", "opcheck"


def _act_forward_backward(device):
    for act, params in (("gelu", []), ("mish", []), ("elu", [1e5, 1.0, 1.0]), ("relu", [])):
        x = _x(device, dtype=torch.float16 if act == "elu" else torch.float32, grad=False)
        if act == "elu":
            x = x * 1000  # outputs overflow fp16: a non-empty exact list
        for save in (True, False):
            torch.library.opcheck(M.activation_forward, (x, act, params, save))
        y, bits, idx, val = M.activation_forward(x, act, params, True)
        out = None if act == "relu" else y
        g = torch.randn_like(x)
        torch.library.opcheck(M.activation_backward, (g, out, bits, idx, val, act, params))


def _norm_calls(device):
    """op name -> opcheck of it (test_norm_ops.py's and test_join_pool_ops.py's shapes)."""

    def t(*shape):
        return torch.randn(*shape, device=device, requires_grad=True)

    x4, w6, b6 = t(4, 6, 5, 5), t(6), t(6)
    x3, w16, b16 = t(4, 5, 16), t(16), t(16)
    r4, r3 = t(4, 6, 5, 5), t(4, 5, 16)
    oc = torch.library.opcheck
    return {
        "layer_norm": lambda: oc(M.layer_norm, (x3, [16], w16, b16, 1e-5)),
        "rms_norm": lambda: oc(M.rms_norm, (x3, [16], w16, 1e-6)),
        "group_norm": lambda: oc(M.group_norm, (x4, 3, w6, b6, 1e-5)),
        "batch_norm": lambda: oc(M.batch_norm, (x4, w6, b6, None, None, True, 0.1, 1e-5, False)),
        "batch_norm_add": lambda: oc(
            M.batch_norm_add, (r4, "relu", [], x4, w6, b6, None, None, True, 0.1, 1e-5, False)
        ),
        "layer_norm_add": lambda: oc(
            M.layer_norm_add, (r3, "gelu", [], x3, [16], w16, b16, 1e-5, True)
        ),
    }


def _consumers_pool_region(device):
    from _gpu_check_ops import REGION_IR

    x = torch.randn(2, 4, 7, 7, device=device, requires_grad=True)
    w = torch.randn(3, 4, 3, 3, device=device, requires_grad=True)
    b = torch.randn(3, device=device, requires_grad=True)
    torch.library.opcheck(M.act_conv2d, (x, w, b, [1, 1], [1, 1], [1, 1], 1, "silu", []))
    h = torch.randn(5, 8, device=device, requires_grad=True)
    lw = torch.randn(6, 8, device=device, requires_grad=True)
    torch.library.opcheck(M.act_linear, (h, lw, None, "gelu_tanh", []))
    xp = torch.randn(2, 3, 9, 9, device=device, requires_grad=True)
    torch.library.opcheck(M.max_pool2d.default, (xp, [3, 3], [2, 2], [1, 1], [1, 1], False))
    a = torch.rand(3, 4, device=device, requires_grad=True) + 0.5
    e = torch.tensor(1.3, device=device, requires_grad=True)
    torch.library.opcheck(M.recompute_region, ([a.detach().requires_grad_(), e], REGION_IR))


def _dropout(device):
    for act, params in (("gelu_tanh", []), ("silu", []), ("elu", [1.0, 1.0, 1.0])):
        x = _x(device)
        torch.library.opcheck(M.activation_dropout, (x, act, params, 0.1, False))
        torch.library.opcheck(M.activation_dropout, (x, act, params, 0.0, True))


def part_opcheck(rows: List[Row], device: str, small: bool) -> None:
    calls = sorted(PUBLIC_CALLS) if not small else ["gelu", "elu", "relu"]
    for name in calls:
        args, kwargs = PUBLIC_CALLS[name]
        op = getattr(M, name.split("_tanh")[0])
        for grad in (True, False):
            check(
                rows,
                "2 opcheck",
                f"{name} ({'grad' if grad else 'no grad'})",
                lambda: _opcheck(
                    lambda: torch.library.opcheck(op, (_x(device, grad=grad),) + args, kwargs)
                ),
            )
    check(
        rows,
        "2 opcheck",
        "activation_forward/backward",
        lambda: _opcheck(lambda: _act_forward_backward(device)),
    )
    check(
        rows,
        "2 opcheck",
        "activation_dropout (eval, p=0)",
        lambda: _opcheck(lambda: _dropout(device)),
    )
    for name, call in _norm_calls(device).items():
        check(rows, "2 opcheck", name, lambda: _opcheck(call))
    check(
        rows,
        "2 opcheck",
        "act_linear/conv2d, max_pool2d, region",
        lambda: _opcheck(lambda: _consumers_pool_region(device)),
    )


# --- part 3: speed ----------------------------------------------------------------------

# Forward + backward bytes ratio, memslim / aten (bench/results/cuda_bytes.md, training step
# table; A ops at N(0, 1) with their exact-list share f, 16-bit from its per-op table).
FAMILY = {
    "gelu": "A", "gelu_tanh": "A", "silu": "A", "mish": "A", "hardswish": "A",
    "softplus": "B", "elu": "B", "celu": "B", "selu": "B", "sigmoid": "B", "tanh": "B",
    "leaky_relu": "D", "hardsigmoid": "D", "relu": "D",
}  # fmt: skip
FLOOR = {"A": (1.015, 1.3), "B": (1.0, 1.0), "D": (0.81, 0.83)}  # (fp32, 16-bit)
FLOOR_16 = {"gelu": 1.19, "gelu_tanh": 1.19, "silu": 1.43, "mish": 1.47, "hardswish": 1.41}


def _timer(device):
    """A function timing fn() in seconds: CUDA events on a GPU, perf_counter elsewhere."""
    import time

    if device.startswith("cuda"):

        def run(fn):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3

        return run

    def run_cpu(fn):
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    return run_cpu


def _speed(name, dtype, device, n, reps):
    from memslim import _numerics as N

    c = N.CASES[name]
    x = torch.randn(n, device=device, dtype=dtype, requires_grad=True)
    g = torch.ones(n, device=device, dtype=dtype)
    timer = _timer(device)

    def step(fn):
        def run():
            fn(x).backward(g)
            x.grad = None

        return run

    steps = (step(c.aten), step(c.ours))
    for s in steps:  # warm-up (the exact list's capacity, the caching allocator)
        s(), s()
    sync(device)
    times = ([], [])
    for _ in range(reps):
        for i, s in enumerate(steps):
            times[i].append(timer(s))
    a, m = statistics.median(times[0]), statistics.median(times[1])
    fam = FAMILY[name]
    floor = FLOOR[fam][0] if dtype == torch.float32 else FLOOR_16.get(name, FLOOR[fam][1])
    ratio = m / a
    value = f"{a * 1e3:.3f} / {m * 1e3:.3f} ms: x{ratio:.2f}"
    status = OK if ratio <= 1.5 * floor else WARN
    if not device.startswith("cuda"):
        status = INFO  # CPU timings of a small smoke say nothing of the GPU's
    return status, value, f"bytes x{floor:.2f} ({fam})"


def part_speed(rows: List[Row], device: str, small: bool) -> None:
    n, reps = (1 << 14, 3) if small else (16 * 1024 * 1024, 20)
    names = list(FAMILY) if not small else ["gelu", "elu", "relu"]
    for dt, short in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for name in names:
            check(rows, "3 speed", f"{name} {short}", lambda: _speed(name, dt, device, n, reps))
