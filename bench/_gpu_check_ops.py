"""bench/gpu_check.py parts 1 and 2: every public op's path on a device against aten's.

What: part 1 holds each op, on `device`, to the bounds its CPU tests use: the activation
ops' numerics (memslim._numerics, test_numerics.py's bars: fp32 gradient error < 1e-4,
16-bit within 2.5x / 4x aten's own near the minimum, 2x elsewhere) and outputs (error
against float64 within 2x aten's + 2 units), NaN / inf / +-0 / huge inputs (NaN
where aten has NaN, aten's values elsewhere), zero-size, scalar and non-contiguous
layouts (test_ops.py's tolerances, aten's strides), saved bytes (saved_tensors_hooks:
the device keeps what the CPU path keeps) and the peak of a step (max_memory_allocated,
against aten's: reported); the norms, residual joins, act_linear / act_conv2d,
max_pool2d, linear_cross_entropy, gated_linear, activation_dropout and recompute_region
against aten on the same device;
coupling_chain and recompute_block through memslim.optimize against eager in float64.
Part 2 runs torch.library.opcheck on the ops with tensors on `device`.
Why: the CUDA kernels had never run on a GPU; the dry run runs the same code on the CPU
at small sizes so that it cannot rot.
"""

from __future__ import annotations

import copy
import math
from typing import List

import torch
import torch.nn.functional as F

from _gpu_check_common import FAIL, WARN, Row, check, fmt, verdict

M = torch.ops.memslim
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHORT = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
}


def _grads(fn, x, g=None):
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y) if g is None else g)
    return y.detach(), gx


# --- part 1: activation ops ---------------------------------------------------------------


def _numerics(name, dtype, device, stride):
    from memslim import _numerics as N

    row = N.table_row(name, dtype, device, stride)
    if dtype == torch.float32:
        return verdict(row["max_err"] < 1e-4), f"grad err {fmt(row['max_err'])}", "< 1e-4"
    if name in N.NON_MONOTONIC:
        ok = row["near_min_err"] <= 4 * row["aten_near_min_err"]
        ok = ok and row["max_err"] <= 2.5 * row["aten_max_err"]
        value = f"{fmt(row['max_err'])} (aten {fmt(row['aten_max_err'])}), near min " + (
            f"{fmt(row['near_min_err'])} (aten {fmt(row['aten_near_min_err'])})"
        )
        return verdict(ok), value, "2.5x aten, 4x near min"
    ok = row["max_err"] <= 2 * row["aten_max_err"] + 1e-6
    return verdict(ok), f"{fmt(row['max_err'])} (aten {fmt(row['aten_max_err'])})", "2x aten"


def _outputs(name, dtype, device, n):
    """Forward error against float64 aten, relative to max(|y|, 1), next to aten's own."""
    from memslim import _numerics as N

    c = N.CASES[name]
    x = (torch.randn(n, device=device, dtype=torch.float64) * 4).to(dtype)
    with torch.no_grad():
        ref = c.aten(x.double())
        scale = ref.abs().clamp_min(1.0)
        e_m = ((c.ours(x).double() - ref).abs() / scale).max().item()
        e_a = ((c.aten(x).double() - ref).abs() / scale).max().item()
    units = 2 * torch.finfo(dtype).eps
    return verdict(e_m <= 2 * e_a + units), f"{fmt(e_m)} (aten {fmt(e_a)})", "2x aten + 2 ulp"


# test_op_edge_values.py's tolerance (relative to max(1, |aten|)) and extremal values.
TOL = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _extremal(dtype):
    fi = torch.finfo(dtype)
    base = [math.nan, math.inf, -math.inf, 0.0, -0.0, fi.tiny, -fi.tiny, fi.tiny / 4]
    base += [fi.max, -fi.max, fi.max / 2, -fi.max / 2, fi.eps, -fi.eps]
    base += [s * v for v in (1.0, 3.0, 10.0, 20.0, 25.0, 90.0, 1e4, 6e4) for s in (1, -1)]
    base += [s * v for v in (1e10, 1e19, 2e19, 1e30, 1e38) if v < fi.max for s in (1, -1)]
    return torch.tensor(base, dtype=torch.float64).to(dtype)


def _like_aten(got, want, x, dtype):
    """'' when got is like aten's want (test_op_edge_values.assert_like_aten: NaN where
    aten has NaN, the same infinities but at the overflow threshold, finite values within
    TOL), else what differs. memslim may give NaN at a NaN input where aten's CUDA formula
    (and its CPU scalar loop) gives the positive branch's value: it propagates the NaN."""
    got, want = got.double(), want.double()
    nan_diff = (got.isnan() != want.isnan()) & ~(x.isnan() & got.isnan())
    if nan_diff.any():
        i = int(nan_diff.nonzero()[0, 0])
        return f"NaN pattern at x={x[i].item():.3g}: {got[i].item():.3g} vs {want[i].item():.3g}"
    inf = want.isinf() | got.isinf()
    at_max = torch.where(got.isinf(), want, got).abs() >= torch.finfo(dtype).max * (1 - TOL[dtype])
    inf_diff = inf & (got != want) & ~(at_max & (torch.sign(got) == torch.sign(want)))
    if inf_diff.any():
        i = int(inf_diff.nonzero()[0, 0])
        return f"infinity at x={x[i].item():.3g}: {got[i].item():.3g} vs {want[i].item():.3g}"
    fin = ~(want.isnan() | inf | got.isnan())
    err = (got - want).abs()[fin] / want.abs()[fin].clamp_min(1.0)
    if err.numel() and err.max() > TOL[dtype]:
        return f"error {err.max().item():.3g} > {TOL[dtype]:g}"
    return ""


def _edges(name, dtype, device):
    """NaN / +-inf / +-0 / subnormal / huge inputs: aten's forward (its CPU scalar loop,
    one path on CUDA) and its gradient (each value repeated 64 times: the vector loop)."""
    from memslim import _numerics as N

    c = N.CASES[name]
    x = _extremal(dtype).to(device)
    y1, g1 = _grads(c.ours, x)
    with torch.no_grad():
        if device == "cpu":
            want_y = torch.stack([c.aten(x[i : i + 1])[0] for i in range(x.numel())])
        else:
            want_y = c.aten(x)
    _, g2 = _grads(c.aten, x.repeat_interleave(64))
    bad = [_like_aten(y1, want_y, x, dtype), _like_aten(g1, g2[::64], x, dtype)]
    bad = [f"{w}: {b}" for w, b in zip(("output", "grad"), bad) if b]
    return verdict(not bad), "; ".join(bad) or f"{x.numel()} values as aten", "TOL of edge tests"


def _layouts(name, device):
    """test_ops.py's layouts (channels_last, strided, transposed, non-dense, empty, 0-dim)."""
    from memslim import _numerics as N

    c = N.CASES[name]
    base = torch.randn(4, 6, 5, 7, device=device)
    inputs = {
        "channels_last": base.to(memory_format=torch.channels_last),
        "strided": base[:, ::2, :, 1:],
        "transposed": base.transpose(1, 3),
        "non_dense": base[:, :, :, 1:].transpose(1, 3),
        "zero_size": torch.randn(0, 3, device=device),
        "scalar": torch.tensor(-0.7, device=device),
    }
    bad = []
    for label, x in inputs.items():
        g = torch.randn_like(x)
        y1, g1 = _grads(c.ours, x, g)
        y2, g2 = _grads(c.aten, x, g)
        atol = 1e-4 * float(g.abs().amax()) if g.numel() else 0.0
        if (
            y1.shape != y2.shape
            or y1.stride() != y2.stride()
            or not torch.allclose(y1, y2, rtol=1e-5, atol=1e-6)
            or not torch.allclose(g1, g2, rtol=1e-4, atol=atol)
        ):
            bad.append(label)
    return verdict(not bad), ("off: " + ", ".join(bad)) if bad else "6 layouts as aten", ""


def _saved_and_peak(name, device, n):
    """Saved bytes on the device against the CPU path's (equal: same bits, same exact
    list), aten's for reference; the step's peak above its inputs against aten's."""
    import memslim
    from memslim import _numerics as N

    c = N.CASES[name]
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 3
    mine = memslim.saved_bytes(c.ours, x.to(device).requires_grad_(), warmup=0)
    cpu = memslim.saved_bytes(c.ours, x.clone().requires_grad_(), warmup=0)
    aten = memslim.saved_bytes(c.aten, x.to(device).requires_grad_(), warmup=0)
    value = f"saved {mine} B (cpu {cpu}, aten {aten})"
    if device.startswith("cuda"):
        peaks = []
        for fn in (c.ours, c.aten):
            xd = x.to(device).requires_grad_()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn(xd).backward(torch.ones_like(xd))
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() - base)
        value += f"; peak {peaks[0]} B (aten {peaks[1]}, x{peaks[0] / max(peaks[1], 1):.2f})"
        if mine == cpu and peaks[0] > 2 * peaks[1]:
            return WARN, value, "saved = cpu; peak <= 2x aten"
    return verdict(mine == cpu), value, "saved = cpu; peak <= 2x aten"


def part_activations(rows: List[Row], device: str, small: bool) -> None:
    from memslim import _numerics as N

    stride, n = (16, 4096) if small else (1, 1 << 20)  # stride: the fp32 sweep only
    for name in sorted(N.CASES):
        for dt in DTYPES:
            check(
                rows,
                "1 ops",
                f"{name} {SHORT[dt]} grads",
                lambda: _numerics(name, dt, device, stride),
            )
            check(
                rows, "1 ops", f"{name} {SHORT[dt]} outputs", lambda: _outputs(name, dt, device, n)
            )
            check(rows, "1 ops", f"{name} {SHORT[dt]} NaN/inf/0", lambda: _edges(name, dt, device))
        check(rows, "1 ops", f"{name} layouts/zero-size", lambda: _layouts(name, device))
        check(rows, "1 ops", f"{name} saved/peak", lambda: _saved_and_peak(name, device, n))


# --- part 1: the other public ops ---------------------------------------------------------


def _bn(op):
    return lambda x, w, b: op(x, w, b, None, None, True, 0.1, 1e-5, False)


NORMS = {  # name -> (aten, memslim, input shape, gamma shape, has beta); test_norm_ops.py's
    "layer_norm": (
        lambda x, w, b: torch.layer_norm(x, [16], w, b, 1e-5),
        lambda x, w, b: M.layer_norm(x, [16], w, b, 1e-5),
        (4, 5, 16),
        (16,),
        True,
    ),
    "rms_norm": (
        lambda x, w, b: torch.rms_norm(x, [16], w, 1e-6),
        lambda x, w, b: M.rms_norm(x, [16], w, 1e-6),
        (4, 5, 16),
        (16,),
        False,
    ),
    "group_norm": (
        lambda x, w, b: torch.group_norm(x, 3, w, b, 1e-5),
        lambda x, w, b: M.group_norm(x, 3, w, b, 1e-5),
        (4, 6, 5, 5),
        (6,),
        True,
    ),
    "batch_norm": (_bn(torch.batch_norm), _bn(M.batch_norm), (4, 6, 5, 5), (6,), True),
}


def _run_all(f, ts, gy=None):
    """[y, grads of every input]; gy None: a seeded N(0, 1) gradient."""
    ins = [t.detach().clone().requires_grad_(True) for t in ts]
    y = f(*ins)
    if gy is None:
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=y.dtype)
    return [y.detach(), *torch.autograd.grad(y, ins, gy.to(y.device))]


def _with_beta(f, has_b):
    return f if has_b else (lambda x, w: f(x, w, None))


def _norm(name, dtype, device):
    """test_norm_ops.py's test_error_like_aten: each result's error against float64 within
    2x aten's own plus (K + 2) units (K = 64 fp32, 2 for 16-bit)."""
    aten, ours, xs, ws, has_b = NORMS[name]
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(xs, generator=g, dtype=torch.float64) * 2 + 0.3).to(dtype).to(device)
    w = torch.randn(ws, generator=g, dtype=torch.float64).to(dtype).to(device)
    w.view(-1)[0] = 0.0  # zero_init_residual: the fallback's channel
    b = (torch.randn(ws, generator=g, dtype=torch.float64) * 0.5).to(dtype).to(device)
    gy = torch.randn(xs, generator=g, dtype=torch.float64).to(dtype).to(device)
    ts = [x, w, b] if has_b else [x, w]
    aten, ours = _with_beta(aten, has_b), _with_beta(ours, has_b)
    ref = _run_all(aten, [t.double() for t in ts], gy.double())
    got_a, got_m = _run_all(aten, ts, gy), _run_all(ours, ts, gy)
    res = torch.finfo(dtype).eps * (66 if dtype == torch.float32 else 4)
    worst = []
    for r, a, m in zip(ref, got_a, got_m):
        scale = r.abs().max().clamp_min(1.0)
        e_a = ((a.double() - r).abs().max() / scale).item()
        e_m = ((m.double() - r).abs().max() / scale).item()
        worst.append((e_m - (2 * e_a + res), e_m, e_a))
    over, e_m, e_a = max(worst)
    return verdict(over <= 0), f"worst {fmt(e_m)} (aten {fmt(e_a)})", "2x aten + (K+2) ulp"


def _join(name, dtype, device):
    """test_join_pool_ops.py's test_error_like_aten: gelu(residual) + norm(x), outputs equal
    to aten's, gradients' error against float64 within 4x aten's + a floor."""
    _, _, xs, ws, has_b = NORMS[name]

    def case(dt):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(xs, generator=g, dtype=torch.float64).to(dt).to(device)
        r = (8.0 * torch.randn(xs, generator=g, dtype=torch.float64)).to(dt).to(device)
        w = (0.5 + torch.rand(ws, generator=g, dtype=torch.float64)).to(dt).to(device)
        b = torch.randn(ws, generator=g, dtype=torch.float64).to(dt).to(device)
        return [t.requires_grad_() for t in ((x, w, b) if has_b else (x, w))] + [r.requires_grad_()]

    def args(ins):
        x, w = ins[0], ins[1]
        b = ins[2] if has_b else None
        return {
            "layer_norm": (x, [16], w, b, 1e-5, True),
            "rms_norm": (x, [16], w, 1e-6),
            "group_norm": (x, 3, w, b, 1e-5, True),
            "batch_norm": (x, w, b, None, None, True, 0.1, 1e-5, False),
        }[name]

    def both(ins):
        # memslim's batch norm computes aten's native formula; on CUDA eager picks cuDNN,
        # whose fp32 output differs from native's in rounding (<= 4.8e-7 on an H200,
        # 2026-11-30): the reference is aten's native one.
        r = ins[-1]
        with torch.backends.cudnn.flags(enabled=False):
            ref = F.gelu(r) + getattr(torch.ops.aten, name)(*args(ins))
        return ref, getattr(M, name + "_add")(r, "gelu", [], *args(ins))

    def grads(y, ins):
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        return torch.autograd.grad(y, ins, gy.to(y.dtype).to(device))

    def rel(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()

    ins64 = case(torch.float64)
    exact = grads(both(ins64)[0], ins64)
    ins = case(dtype)
    ref, out = both(ins)
    same = torch.allclose(ref.double(), out.double(), rtol=0, atol=0)
    floor = 1e-6 if dtype == torch.float32 else 1e-2
    errs = [(rel(m, e), rel(a, e)) for m, a, e in zip(grads(out, ins), grads(ref, ins), exact)]
    ok = same and all(m <= 4 * a + floor for m, a in errs)
    m, a = max(errs)
    return (
        verdict(ok),
        f"out {'=' if same else '!='} aten; grad {fmt(m)} (aten {fmt(a)})",
        "4x aten",
    )


def _act_consumers(device):
    """act_linear / act_conv2d of every kernel activation: values equal aten's, gradients
    within 1e-5 relative (aten's act recomputed; CUDA's GEMMs may differ between calls)."""
    acts = {
        "gelu": F.gelu,
        "silu": F.silu,
        "mish": F.mish,
        "hardswish": F.hardswish,
        "sigmoid": torch.sigmoid,
        "relu": F.relu,
        "elu": lambda t: F.elu(t, 0.5),
    }
    params = {"elu": [0.5, 1.0, 1.0]}
    g = torch.Generator().manual_seed(0)
    h = torch.randn(64, 32, generator=g).to(device)
    w = torch.randn(16, 32, generator=g).to(device)
    xc = torch.randn(2, 4, 9, 9, generator=g).to(device).to(memory_format=torch.channels_last)
    wc = torch.randn(3, 4, 3, 3, generator=g).to(device)
    bad = []
    for act, f in acts.items():
        p = params.get(act, [])
        for label, mine, ref, ts in (
            (
                "linear",
                lambda a, b: M.act_linear(a, b, None, act, p),
                lambda a, b: F.linear(f(a), b),
                (h, w),
            ),
            (
                "conv2d",
                lambda a, b: M.act_conv2d(a, b, None, [2, 1], [1, 1], [1, 1], 1, act, p),
                lambda a, b: F.conv2d(f(a), b, None, [2, 1], [1, 1], [1, 1], 1),
                (xc, wc),
            ),
        ):
            r1, r2 = _run_all(mine, list(ts)), _run_all(ref, list(ts))
            if not torch.equal(r1[0], r2[0]) or not all(
                torch.allclose(u, v, rtol=1e-5, atol=1e-5 * float(v.abs().max()))
                for u, v in zip(r1[1:], r2[1:])
            ):
                bad.append(f"{act} {label}")
    return verdict(not bad), ("off: " + ", ".join(bad)) if bad else "14 as aten", "= aten"


def _max_pool(device):
    """test_join_pool_ops.py's cases: output and gradient equal aten's bit for bit (NaN and
    -inf inside windows, channels_last)."""
    cases = [
        ((2, 3, 17, 19), (3, 3), (2, 2), (1, 1), (1, 1), False),
        ((2, 3, 17, 19), (3, 3), (2, 2), (1, 1), (1, 1), True),
        ((3, 15, 14), (3, 2), (1, 2), (1, 0), (2, 1), True),
        ((2, 2, 12, 12), (12, 12), (), (0,), (1,), False),
    ]
    bad = []
    for i, (shape, k, s, p, d, c) in enumerate(cases):
        for cl in (False, True):
            x = torch.randn(*shape)
            x.view(-1)[0] = float("nan")
            if x.dim() == 4:
                x[0, 1] = float("-inf")
                x[-1, 0, 2:5, 2:5] = float("nan")
            x = x.to(device)
            if cl and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            x.requires_grad_()
            ref, out = F.max_pool2d(x, k, s, p, d, c), M.max_pool2d(x, k, s, p, d, c)
            g = torch.randn_like(ref)
            (gr,) = torch.autograd.grad(ref, x, g)
            (go,) = torch.autograd.grad(out, x, g)
            if not (
                torch.equal(ref.nan_to_num(), out.nan_to_num())
                and out.stride() == ref.stride()
                and torch.equal(gr, go)
            ):
                bad.append(f"case {i}{' cl' if cl else ''}")
    return verdict(not bad), ("off: " + ", ".join(bad)) if bad else "8 cases bit for bit", "= aten"


def _loss_head(dtype, device):
    """linear_cross_entropy (both backwards) against aten's linear + cross_entropy: loss and
    gradients within test_loss_head_op.py's bounds (fp32 1e-5; bf16 logits cast to float,
    as transformers' loss: 2e-2), and the peak below aten's by most of the logits."""
    gen = torch.Generator().manual_seed(0)
    n, d, v = 512, 64, 8192
    h = torch.randn(n, d, generator=gen).to(device, dtype).requires_grad_()
    w = (torch.randn(v, d, generator=gen) * 0.1).to(device, dtype).requires_grad_()
    t = torch.randint(0, v, (n,), generator=gen).to(device)
    t[:9] = -100
    cast = torch.float32 if dtype != torch.float32 else None
    bound = 1e-5 if dtype == torch.float32 else 2e-2

    def aten():
        z = F.linear(h, w)
        return F.cross_entropy(z.float() if cast else z, t, ignore_index=-100)

    worst = 0.0
    ref = aten()
    want = torch.autograd.grad(ref, (h, w))
    for gif in (True, False):
        got = M.linear_cross_entropy(h, w, None, t, 1, -100, 0.0, cast, 0, gif)
        grads = torch.autograd.grad(got, (h, w))
        worst = max(worst, float((got - ref).abs() / ref.abs()))
        for a, b in zip(grads, want):
            worst = max(worst, float((a.float() - b.float()).norm() / b.float().norm()))
    return verdict(worst <= bound), f"rel. diff {fmt(worst)} (bound {bound:g})", "= aten"


def _gated(device):
    """gated_linear of silu / gelu_tanh: values and gradients equal aten's bit for bit."""
    gen = torch.Generator().manual_seed(0)
    bad = []
    for act, f in (("silu", F.silu), ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"))):
        g, u = (torch.randn(64, 96, generator=gen).to(device).requires_grad_() for _ in range(2))
        w = torch.randn(32, 96, generator=gen).to(device).requires_grad_()
        ref, got = F.linear(f(g) * u, w), M.gated_linear(g, u, w, None, act, [])
        seed = torch.randn_like(ref)
        same = torch.equal(ref, got) and all(
            torch.equal(a, b)
            for a, b in zip(
                torch.autograd.grad(got, (g, u, w), seed), torch.autograd.grad(ref, (g, u, w), seed)
            )
        )
        if not same:
            bad.append(act)
    return verdict(not bad), ("off: " + ", ".join(bad)) if bad else "bit for bit", "= aten"


def _activation_dropout(act, dtype, device):
    """test_cuda.py's check: kept elements act(x) / (1 - p), about 1 - p of them kept, the
    gradient act'(x) / (1 - p) on them and 0 elsewhere."""
    aten = {"gelu": F.gelu, "silu": F.silu, "mish": F.mish, "hardswish": F.hardswish, "elu": F.elu}
    params = [1.0, 1.0, 1.0] if act == "elu" else []
    p = 0.25
    torch.manual_seed(0)
    x = (torch.randn(64, 1000, dtype=torch.float64) * 3).to(dtype).to(device).requires_grad_()
    g = torch.randn(64, 1000, dtype=torch.float64).to(dtype).to(device)
    y = M.activation_dropout(x, act, params, p, True)
    (gx,) = torch.autograd.grad(y, x, g)
    x64 = x.detach().double().requires_grad_()
    a = aten[act](x64)
    (ga,) = torch.autograd.grad(a, x64, g.double())
    kept, nz = y != 0, a.detach() != 0
    frac = float(kept[nz].double().mean())
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    ref = (a.detach() / (1 - p)).to(dtype)
    ok_y = torch.allclose(y[kept].double(), ref[kept].double(), rtol=tol, atol=tol)
    gref = (ga / (1 - p)).to(dtype).double()
    err = float((gx[kept].double() - gref[kept]).abs().max()) / float(gref.abs().max())
    dropped = ~kept & nz
    ok = 0.70 < frac < 0.80 and ok_y and err <= 10 * tol and float(gx[dropped].abs().sum()) == 0
    return verdict(ok), f"kept {frac:.3f}, grad err {fmt(err)}", "kept 0.7-0.8, 10x tol"


REGION_IR = """graph(%x : Tensor, %a : Tensor):
  %one : int = prim::Constant[value=1]()
  %c : float = prim::Constant[value=1.]()
  %p : Tensor = aten::pow(%x, %a)
  %e : Tensor = aten::exp(%p)
  %s : Tensor = aten::add(%e, %c, %one)
  %m : Tensor = aten::gt(%x, %c)
  return (%s, %m)"""


def _region(device):
    """test_cuda.py's recompute_region check: aten's values and gradients, keeps only its
    inputs."""
    import memslim

    torch.manual_seed(0)
    x = (torch.rand(1 << 16, device=device) + 0.5).requires_grad_()
    a = torch.tensor(1.3, device=device, requires_grad=True)
    s, m = M.recompute_region([x, a], REGION_IR)
    w = torch.randn(1 << 16, device=device)
    gx, ga = torch.autograd.grad((s * w).sum(), [x, a])
    ref = torch.exp(torch.pow(x, a)) + 1.0
    rx, ra = torch.autograd.grad((ref * w).sum(), [x, a])
    ok = torch.equal(s, ref.detach()) and torch.equal(m, x > 1.0)
    ok = (
        ok
        and torch.allclose(gx, rx, rtol=1e-6, atol=0)
        and torch.allclose(ga, ra, rtol=1e-5, atol=0)
    )
    xs = (torch.rand(1 << 16, device=device) + 0.5).requires_grad_()
    saved = memslim.saved_bytes(lambda t: M.recompute_region([t, a], REGION_IR)[0], xs, warmup=0)
    ok = ok and saved == (1 << 16) * 4 + 4
    return verdict(ok), f"saved {saved} B", "= aten; inputs only"


def _optimized_like_eager(kind, device):
    """coupling_chain (a small RevNet) and recompute_block (a ConvNet at memory_budget
    0.25) through memslim.optimize, float64: gradients of two steps within 1e-9 of eager."""
    import memslim
    from memslim._models import RevNet

    torch.manual_seed(0)
    if kind == "coupling_chain":
        model = RevNet(widths=(8, 16), blocks=(3, 3)).double().to(device)
        opt_kw = {}
    else:
        model = (
            torch.nn.Sequential(
                *[
                    torch.nn.Sequential(
                        torch.nn.Conv2d(c, 8, 3, padding=1, bias=False),
                        torch.nn.BatchNorm2d(8),
                        torch.nn.GELU(),
                    )
                    for c in (3, 8, 8, 8)
                ],
                torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(),
                torch.nn.Linear(8, 10),
            )
            .double()
            .to(device)
        )
        opt_kw = {"memory_budget": 0.25}
    ref, base = copy.deepcopy(model), copy.deepcopy(model)
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64, device=device)
    opt = memslim.optimize(base, (x,), **opt_kw)
    if f"memslim::{kind}" not in str(opt.graph):
        return FAIL, f"no memslim::{kind} in the optimized graph", ""
    worst = 0.0
    for seed in range(2):
        torch.manual_seed(seed)
        w = torch.randn(4, 10, dtype=torch.float64, device=device)
        ga = torch.autograd.grad((ref(x) * w).sum(), list(ref.parameters()))
        gb = torch.autograd.grad((opt(x) * w).sum(), list(base.parameters()))
        worst = max(
            worst, max(((a - b).norm() / b.norm().clamp_min(1e-300)).item() for a, b in zip(ga, gb))
        )
    return verdict(worst < 1e-9), f"grad diff {fmt(worst)}", "< 1e-9"


def part_others(rows: List[Row], device: str, small: bool) -> None:
    for name in NORMS:
        for dt in DTYPES:
            check(rows, "1 ops", f"{name} {SHORT[dt]}", lambda: _norm(name, dt, device))
        for dt in (torch.float32, torch.bfloat16):
            check(rows, "1 ops", f"{name}_add {SHORT[dt]}", lambda: _join(name, dt, device))
    check(rows, "1 ops", "act_linear/act_conv2d", lambda: _act_consumers(device))
    check(rows, "1 ops", "max_pool2d", lambda: _max_pool(device))
    for dt in (torch.float32, torch.bfloat16):
        check(rows, "1 ops", f"linear_cross_entropy {SHORT[dt]}", lambda: _loss_head(dt, device))
    check(rows, "1 ops", "gated_linear", lambda: _gated(device))
    if device.startswith("cuda"):  # the CUDA generator's mask; the CPU tests cover the CPU's
        for act in ("gelu", "silu", "mish", "hardswish", "elu"):
            for dt in (torch.float32, torch.float16):
                check(
                    rows,
                    "1 ops",
                    f"activation_dropout {act} {SHORT[dt]}",
                    lambda: _activation_dropout(act, dt, device),
                )
    else:
        check(
            rows,
            "1 ops",
            "activation_dropout gelu fp32",
            lambda: _activation_dropout("gelu", torch.float32, device),
        )
    check(rows, "1 ops", "recompute_region", lambda: _region(device))
    for kind in ("coupling_chain", "recompute_block"):
        check(
            rows, "1 ops", f"{kind} (memslim.optimize)", lambda: _optimized_like_eager(kind, device)
        )
