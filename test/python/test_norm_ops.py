"""memslim's output-saving norms against aten: values, gradients, gamma edge cases, modes.

What: memslim::layer_norm / rms_norm / group_norm / batch_norm keep their output
and rstd and rebuild x_hat = (y - beta) / gamma in backward; channels whose gamma
cannot be inverted within the bound keep their x_hat slice (norm_fallback). Here:
gradients against aten in fp64 (tight) and fp32/16-bit (error against an fp64
reference, next to aten's own), gamma = 0 / tiny / non-finite / |beta| >> |gamma|,
running statistics, eval mode, layouts, affine off, NaN, saved bytes, opcheck and
torch.compile with dynamic shapes.
"""

import pytest
import torch

import memslim  # noqa: F401  (registers torch.ops.memslim)

M = torch.ops.memslim


def _bn(op):
    return lambda x, w, b, **k: op(
        x, w, b, k.get("rm"), k.get("rv"), k.get("training", True), 0.1, 1e-5, False
    )


# name -> (aten call, memslim call, input shape, gamma shape, has beta)
NORMS = {
    "layer_norm": (
        lambda x, w, b, **k: torch.layer_norm(x, [16], w, b, 1e-5),
        lambda x, w, b, **k: M.layer_norm(x, [16], w, b, 1e-5),
        (4, 5, 16),
        (16,),
        True,
    ),
    "layer_norm_2d": (
        lambda x, w, b, **k: torch.layer_norm(x, [5, 16], w, b, 1e-5),
        lambda x, w, b, **k: M.layer_norm(x, [5, 16], w, b, 1e-5),
        (4, 5, 16),
        (5, 16),
        True,
    ),
    "rms_norm": (
        lambda x, w, b, **k: torch.rms_norm(x, [16], w, 1e-6),
        lambda x, w, b, **k: M.rms_norm(x, [16], w, 1e-6),
        (4, 5, 16),
        (16,),
        False,
    ),
    "group_norm": (
        lambda x, w, b, **k: torch.group_norm(x, 3, w, b, 1e-5),
        lambda x, w, b, **k: M.group_norm(x, 3, w, b, 1e-5),
        (4, 6, 5, 5),
        (6,),
        True,
    ),
    "batch_norm": (_bn(torch.batch_norm), _bn(M.batch_norm), (4, 6, 5, 5), (6,), True),
}


def _inputs(name, dtype, gamma=None, seed=0):
    _, _, xs, ws, has_b = NORMS[name]
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(xs, generator=g, dtype=torch.float64) * 2 + 0.3).to(dtype)
    w = torch.randn(ws, generator=g, dtype=torch.float64).to(dtype) if gamma is None else gamma
    b = (torch.randn(ws, generator=g, dtype=torch.float64) * 0.5).to(dtype) if has_b else None
    gy = torch.randn(xs, generator=g, dtype=torch.float64).to(dtype)
    return x, w, b, gy


def _run(f, x, w, b, gy, **k):
    ins = [t.detach().clone().requires_grad_(True) for t in (x, w, b) if t is not None]
    y = f(*ins, **k) if b is not None else f(ins[0], ins[1], None, **k)
    gs = torch.autograd.grad(y, ins, gy)
    return [y.detach(), *gs]


def _gamma_edges(name, dtype):
    """gamma with a zero, a tiny, a NaN-free non-finite-free huge-ratio channel."""
    _, _, _, ws, _ = NORMS[name]
    w = torch.randn(ws, dtype=torch.float64)
    flat = w.view(-1)
    flat[0] = 0.0  # zero_init_residual
    flat[1] = 1e-12  # |beta| >> |gamma|
    flat[2] = -3e-3
    return w.to(dtype)


@pytest.mark.parametrize("edges", [False, True], ids=["gamma", "gamma_edges"])
@pytest.mark.parametrize("name", sorted(NORMS))
def test_fp64_matches_aten(name, edges):
    aten, ours, *_ = NORMS[name]
    gamma = _gamma_edges(name, torch.float64) if edges else None
    x, w, b, gy = _inputs(name, torch.float64, gamma)
    for a, m, what in zip(
        _run(aten, x, w, b, gy), _run(ours, x, w, b, gy), ["y", "grad x", "grad gamma", "grad beta"]
    ):
        torch.testing.assert_close(m, a, rtol=1e-10, atol=1e-10, msg=f"{name} {what}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("edges", [False, True], ids=["gamma", "gamma_edges"])
@pytest.mark.parametrize("name", sorted(NORMS))
def test_error_like_aten(name, edges, dtype):
    # Error against the fp64 result on the same (rounded) inputs, next to aten's
    # own error in `dtype`: memslim's within 2x aten's plus the rebuild's bound
    # (norm_ops.cpp's header: about (K + 2) units of `dtype`, K = 64 for fp32,
    # 2 for 16-bit outputs).
    aten, ours, *_ = NORMS[name]
    gamma = _gamma_edges(name, dtype) if edges else None
    x, w, b, gy = _inputs(name, dtype, gamma, seed=1)
    ref = _run(aten, *(t.double() if t is not None else None for t in (x, w, b, gy)))
    got_aten = _run(aten, x, w, b, gy)
    got_ours = _run(ours, x, w, b, gy)
    res = torch.finfo(dtype).eps * (66 if dtype == torch.float32 else 4)
    for r, a, m, what in zip(ref, got_aten, got_ours, ["y", "grad x", "grad gamma", "grad beta"]):
        scale = r.abs().max().clamp_min(1.0)
        err_a = ((a.double() - r).abs().max() / scale).item()
        err_m = ((m.double() - r).abs().max() / scale).item()
        assert err_m <= 2 * err_a + res, f"{name} {what}: memslim {err_m:.2e}, aten {err_a:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-30, 1e-9, 1e-3, 1e6, 1e25])
def test_batch_norm_gamma_scales(dtype, scale):
    # gamma across the opmath range, |beta| <= 64 |gamma| (every channel inverts):
    # the training backward runs from y (mean = beta, invstd = 1 / gamma, weight
    # gamma^2 rstd) where gamma, 1 / gamma and gamma^2 rstd are normal numbers, and
    # rebuilds x_hat where they are not (1e-30, 1e25 in fp32). Both within aten's
    # own error against fp64, as test_error_like_aten.
    aten, ours, *_ = NORMS["batch_norm"]
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(4, 6, 5, 5, generator=g, dtype=torch.float64) * 2 + 0.3).to(dtype)
    w = (scale * (0.5 + torch.rand(6, generator=g, dtype=torch.float64))).to(dtype)
    w[1] = -w[1]
    b = (w.double() * 8 * torch.randn(6, generator=g, dtype=torch.float64)).to(dtype)
    gy = torch.randn(4, 6, 5, 5, generator=g, dtype=torch.float64).to(dtype)
    ref = _run(aten, x.double(), w.double(), b.double(), gy.double())
    got_aten = _run(aten, x, w, b, gy)
    got_ours = _run(ours, x, w, b, gy)
    res = torch.finfo(dtype).eps * 66
    for r, a, m, what in zip(ref, got_aten, got_ours, ["y", "grad x", "grad gamma", "grad beta"]):
        assert m.isfinite().all(), what
        scale_r = r.abs().max().clamp_min(1e-300)
        err_a = ((a.double() - r).abs().max() / scale_r).item()
        err_m = ((m.double() - r).abs().max() / scale_r).item()
        assert err_m <= 2 * err_a + res, f"{what}: memslim {err_m:.2e}, aten {err_a:.2e}"


def test_fallback_picks_the_channels_gamma_cannot_invert():
    x = torch.randn(2, 6, 3, 3)
    w = torch.tensor([1.0, 0.0, 1e-9, float("nan"), 0.5, float("inf")])
    b = torch.tensor([0.1, 0.1, 1.0, 0.0, 31.0, 0.0])  # |b| <= 64 |w| for 0.5 / 31
    y, mean, rstd = torch.ops.aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    idx, xh = M.norm_fallback(x, mean, rstd, w, b, "batch_norm", 1, 1, torch.float32)
    assert idx.tolist() == [1, 2, 3, 5]
    want = (x - mean.view(1, 6, 1, 1)) * rstd.view(1, 6, 1, 1)
    torch.testing.assert_close(xh, want[:, idx].reshape(2, 4, 9))
    # 16-bit outputs invert only |beta| <= 2 |gamma|: channel 4 joins.
    idx16, _ = M.norm_fallback(x, mean, rstd, w, b, "batch_norm", 1, 1, torch.bfloat16)
    assert idx16.tolist() == [1, 2, 3, 4, 5]


def test_fallback_takes_channels_whose_mean_dwarfs_their_spread():
    # aten's CPU batch / group norm compute y = x * scale + shift, whose rounding is
    # u |mean| rstd in x_hat's units: a channel with |mean| rstd over the bound (64
    # for fp32 outputs, 2 u16 / u32 for 16-bit ones) keeps its x_hat, as does an
    # exactly constant one (rstd = 1 / sqrt(eps), seed 700679).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 3, 3, generator=g)
    x[:, 1] = 3.0  # constant: rstd = 316, |mean| rstd = 949
    x[:, 2] = 100.0 + torch.randn(4, 3, 3, generator=g)  # |mean| rstd ~ 100
    x[:, 3] = 10.0 + torch.randn(4, 3, 3, generator=g)  # ~ 10: rebuilt
    w, b = torch.ones(5), torch.zeros(5)
    y, mean, rstd = torch.ops.aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    idx, _ = M.norm_fallback(x, mean, rstd, w, b, "batch_norm", 1, 1, torch.float32)
    assert idx.tolist() == [1, 2]
    idx16, _ = M.norm_fallback(x, mean, rstd, w, b, "batch_norm", 1, 1, torch.bfloat16)
    assert idx16.tolist() == []
    # Group norm: per (sample, group) statistics; a group of one sample over the bound
    # sends its channels.
    xg = torch.randn(2, 4, 3, 3, generator=g)
    xg[1, 2:] = 5.0
    yg, mg, rg = torch.ops.aten.native_group_norm(xg, w[:4], b[:4], 2, 4, 9, 2, 1e-5)
    idxg, _ = M.norm_fallback(xg, mg, rg, w[:4], b[:4], "group_norm", 1, 2, torch.float32)
    assert idxg.tolist() == [2, 3]
    # And the constant channel's gamma gradient is aten's, exactly 0.
    gy = torch.randn(x.shape, generator=g)
    a = _run(NORMS["batch_norm"][0], x, w, b, gy)
    m = _run(NORMS["batch_norm"][1], x, w, b, gy)
    assert a[2][1].item() == 0.0 and m[2][1].item() == 0.0
    torch.testing.assert_close(m[2], a[2], rtol=1e-5, atol=1e-5)


def test_zero_init_residual_is_exact():
    # gamma = 0 (torchvision's zero_init_residual): y = beta carries no x_hat;
    # the kept slice gives grad gamma exactly as aten's.
    x, _, b, gy = _inputs("batch_norm", torch.float32)
    w = torch.zeros(6)
    a = _run(NORMS["batch_norm"][0], x, w, b, gy)
    m = _run(NORMS["batch_norm"][1], x, w, b, gy)
    assert torch.equal(a[1], m[1])  # grad x: zero
    torch.testing.assert_close(m[2], a[2], rtol=1e-6, atol=1e-5)


def test_batch_norm_running_stats_and_eval():
    x = torch.randn(8, 6, 4, 4) * 3 + 1
    states = [(torch.zeros(6), torch.ones(6)) for _ in range(2)]
    for op, (rm, rv) in zip((torch.batch_norm, M.batch_norm), states):
        op(x, None, None, rm, rv, True, 0.1, 1e-5, False)
    assert torch.equal(states[0][0], states[1][0]) and torch.equal(states[0][1], states[1][1])
    # Eval mode: the running statistics, gradients as aten's.
    w, b = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    rm, rv = torch.randn(6, dtype=torch.float64), torch.rand(6, dtype=torch.float64) + 0.5
    xd, gy = x.double(), torch.randn(8, 6, 4, 4, dtype=torch.float64)
    a = _run(NORMS["batch_norm"][0], xd, w, b, gy, rm=rm, rv=rv, training=False)
    m = _run(NORMS["batch_norm"][1], xd, w, b, gy, rm=rm, rv=rv, training=False)
    for u, v in zip(a, m):
        torch.testing.assert_close(v, u, rtol=1e-10, atol=1e-10)


def test_nn_modules_through_memslim_ops_layouts_and_affine_off():
    cases = [
        (torch.nn.BatchNorm2d(6), torch.randn(4, 6, 5, 5).to(memory_format=torch.channels_last)),
        (torch.nn.BatchNorm1d(6, affine=False), torch.randn(8, 6)),
        (torch.nn.LayerNorm(16, elementwise_affine=False), torch.randn(3, 16)),
        (torch.nn.LayerNorm(16, bias=False), torch.randn(16)),  # a 1-d input
        (torch.nn.LayerNorm(16), torch.randn(5, 16, 3).transpose(1, 2)),  # not contiguous
        (torch.nn.GroupNorm(2, 6, affine=False), torch.randn(2, 6, 7)),
        (torch.nn.RMSNorm(16), torch.randn(2, 3, 16)),
    ]
    for mod, x in cases:
        name = type(mod).__name__
        kind = {
            "BatchNorm2d": "batch_norm",
            "BatchNorm1d": "batch_norm",
            "LayerNorm": "layer_norm",
            "GroupNorm": "group_norm",
            "RMSNorm": "rms_norm",
        }[name]
        ref = _grads_of(mod, x, None)
        got = _grads_of(mod, x, kind)
        for r, g in zip(ref, got):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5, msg=name)


def _grads_of(mod, x, kind):
    """Values and gradients of `mod` on x; with `kind`, torch.<kind> (what
    torch.nn.functional calls) is memslim's op."""
    import copy

    mod = copy.deepcopy(mod)
    x = x.detach().clone().requires_grad_(True)
    real = getattr(torch, kind) if kind else None
    try:
        if kind:
            setattr(torch, kind, getattr(M, kind))
        y = mod(x)
    finally:
        if kind:
            setattr(torch, kind, real)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    params = [p for p in mod.parameters()]
    gs = torch.autograd.grad(y, [x] + params, gy)
    return [y.detach(), *gs]


def test_nan_and_inf_as_aten():
    x, w, b, gy = _inputs("layer_norm", torch.float32)
    x[0, 0, 3] = float("nan")
    x[1, 2, 5] = float("inf")
    a = _run(NORMS["layer_norm"][0], x, w, b, gy)
    m = _run(NORMS["layer_norm"][1], x, w, b, gy)
    for u, v in zip(a, m):
        assert torch.equal(u.isnan(), v.isnan())
        torch.testing.assert_close(v.nan_to_num(), u.nan_to_num(), rtol=1e-4, atol=1e-4)


def test_keeps_output_not_input():
    lin = torch.nn.Linear(64, 64)
    # gamma away from zero: no channel keeps an x_hat slice.
    w = torch.nn.Parameter(torch.rand(64) + 0.5)
    b = torch.nn.Parameter(torch.randn(64))
    x = torch.randn(32, 64, requires_grad=True)
    aten = memslim.saved_bytes(lambda t: lin(torch.layer_norm(t, [64], w, b)), x)
    ours = memslim.saved_bytes(lambda t: lin(M.layer_norm(t, [64], w, b)), x)
    assert aten - ours >= 32 * 64 * 4  # the input's bytes


def test_double_backward_raises():
    x = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    y = M.layer_norm(x, [16], torch.randn(16, dtype=torch.float64), None)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


OPCHECK = {
    "layer_norm": lambda x, w, b: (M.layer_norm, (x, [16], w, b, 1e-5)),
    "rms_norm": lambda x, w, b: (M.rms_norm, (x, [16], w, 1e-6)),
    "group_norm": lambda x, w, b: (M.group_norm, (x, 3, w, b, 1e-5)),
    "batch_norm": lambda x, w, b: (M.batch_norm, (x, w, b, None, None, True, 0.1, 1e-5, False)),
}


@pytest.mark.parametrize("name", sorted(OPCHECK))
def test_opcheck(name):
    x, w, b, _ = _inputs(name, torch.float32, _gamma_edges(name, torch.float32))
    op, args = OPCHECK[name](
        x.requires_grad_(), w.requires_grad_(), b.requires_grad_() if b is not None else None
    )
    torch.library.opcheck(op, args)


def test_compile_dynamic_shapes():
    # Under torch.compile the fallback count is an unbacked size (the fake impl).
    w = torch.randn(16, dtype=torch.float64)
    w[0] = 0
    b = torch.randn(16, dtype=torch.float64)

    def f(x):
        return M.layer_norm(x, [16], w, b, 1e-5).sin()

    cf = torch.compile(f, dynamic=True, backend="aot_eager", fullgraph=True)
    for n in (3, 7):
        x = torch.randn(n, 16, dtype=torch.float64)
        gy = torch.randn(n, 16, dtype=torch.float64)
        out = []
        for fn in (f, cf):
            xi = x.clone().requires_grad_(True)
            y = fn(xi)
            out.append((y.detach(), torch.autograd.grad(y, xi, gy)[0]))
        for u, v in zip(*out):
            torch.testing.assert_close(v, u, rtol=1e-10, atol=1e-10)
