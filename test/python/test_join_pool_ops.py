"""memslim's residual joins (memslim::<norm>_add) and memslim::max_pool2d against aten.

What: <norm>_add(residual, act, params, <norm args>) = act(residual) + norm(input)
keeps its output and `residual` and rebuilds the norm's output as
out - act(residual) in backward; channels where gamma cannot be inverted, or where
the residual is too large against gamma for the rebuild to stay within the bound,
keep their x_hat slice. memslim::max_pool2d keeps the position of each maximum in
its window (int8) and rebuilds aten's indices: gradients equal aten's bit for bit.
Here: fp64 against aten (tight), fp32 / bf16 errors against an fp64 reference next
to aten's own, zero / tiny gamma, a residual 1e6 x gamma, running statistics, NaN,
what each keeps (saved_tensors_hooks), opcheck, torch.compile with dynamic shapes.
"""

import pytest
import torch
import torch.nn.functional as F

import memslim  # noqa: F401  (registers torch.ops.memslim)

M = torch.ops.memslim
ACTS = {
    "none": lambda t: t,
    "relu": torch.relu,
    "gelu": F.gelu,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
}


def _bn_args(x, w, b, rm=None, rv=None, training=True):
    return (x, w, b, rm, rv, training, 0.1, 1e-5, False)


# name -> (norm args from (x, w, b), input shape, gamma shape)
NORMS = {
    "batch_norm": (lambda x, w, b: _bn_args(x, w, b), (4, 6, 5, 5), (6,)),
    "layer_norm": (lambda x, w, b: (x, [16], w, b, 1e-5, True), (4, 5, 16), (16,)),
    "rms_norm": (lambda x, w, b: (x, [16], w, 1e-6), (4, 5, 16), (16,)),
    "group_norm": (lambda x, w, b: (x, 3, w, b, 1e-5, True), (4, 6, 5, 5), (6,)),
}


def _case(name, dtype, act, gamma=None, residual_scale=1.0, seed=0):
    args_of, xs, ws = NORMS[name]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(xs, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    r = (residual_scale * torch.randn(xs, generator=g, dtype=torch.float64)).to(dtype)
    r.requires_grad_()
    w = gamma if gamma is not None else 0.5 + torch.rand(ws, generator=g, dtype=torch.float64)
    w = w.to(dtype).requires_grad_()
    b = torch.randn(ws, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    args = args_of(x, w, b)
    ins = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad] + [r]
    return args, r, ins


def _both(name, args, r, act):
    ref = ACTS[act](r) + getattr(torch.ops.aten, name)(*args)
    out = getattr(M, name + "_add")(r, act, [], *args)
    return ref, out


def _grads(y, ins, seed=1):
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.autograd.grad(y, ins, g.to(y.dtype))


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("act", ACTS)
def test_fp64_matches_aten(name, act):
    args, r, ins = _case(name, torch.float64, act)
    ref, out = _both(name, args, r, act)
    assert torch.equal(ref, out)
    for a, b in zip(_grads(out, ins), _grads(ref, ins)):
        assert _rel(a, b) < 1e-10


@pytest.mark.parametrize("name", NORMS)
def test_gamma_zero_tiny_and_large_residual_exact(name):
    # gamma 0 (zero_init_residual), 1e-9, and a residual 1e6 x gamma: those channels
    # keep x_hat, the rest rebuild; fp64 to 1e-10 either way.
    _, _, ws = NORMS[name]
    gamma = torch.full(ws, 0.7, dtype=torch.float64)
    gamma.view(-1)[0], gamma.view(-1)[1] = 0.0, 1e-9
    for scale in (1.0, 1e6):
        args, r, ins = _case(name, torch.float64, "relu", gamma=gamma, residual_scale=scale)
        ref, out = _both(name, args, r, "relu")
        for a, b in zip(_grads(out, ins), _grads(ref, ins)):
            assert _rel(a, b) < 1e-10


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_error_like_aten(name, dtype):
    # Both against an fp64 reference: memslim's error within 4x aten's (+ a floor).
    args64, r64, ins64 = _case(name, torch.float64, "gelu", residual_scale=8.0)
    ref64, _ = _both(name, args64, r64, "gelu")
    exact = _grads(ref64, ins64)
    args, r, ins = _case(name, dtype, "gelu", residual_scale=8.0)
    ref, out = _both(name, args, r, "gelu")
    assert torch.equal(ref, out)
    floor = 1e-6 if dtype == torch.float32 else 1e-2
    for a, b, e in zip(_grads(out, ins), _grads(ref, ins), exact):
        assert _rel(a, e) <= 4 * _rel(b, e) + floor


def test_batch_norm_running_stats_and_eval():
    x = torch.randn(4, 6, 5, 5, requires_grad=True)
    r = torch.randn(4, 6, 5, 5, requires_grad=True)
    w, b = torch.rand(6).requires_grad_(), torch.randn(6).requires_grad_()
    rm, rv, rm2, rv2 = torch.zeros(6), torch.ones(6), torch.zeros(6), torch.ones(6)
    for training in (True, False):
        ref = torch.relu(r) + torch.batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5, False)
        out = M.batch_norm_add(r, "relu", [], x, w, b, rm2, rv2, training, 0.1, 1e-5, False)
        assert torch.equal(ref, out) and torch.equal(rm, rm2) and torch.equal(rv, rv2)
        for a, c in zip(_grads(out, [x, r, w, b]), _grads(ref, [x, r, w, b])):
            assert _rel(a, c) < 1e-5


def test_nan_and_inf_as_aten():
    args, r, ins = _case("batch_norm", torch.float32, "relu")
    with torch.no_grad():
        r[0, 0, 0, 0] = float("nan")
        r[1, 2, 0, 0] = float("inf")
    ref, out = _both("batch_norm", args, r, "relu")
    assert torch.equal(ref.isnan(), out.isnan()) and torch.equal(ref.nan_to_num(), out.nan_to_num())
    for a, b in zip(_grads(out, ins), _grads(ref, ins)):
        assert torch.equal(a.isnan(), b.isnan())


def _saved(fn):
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        out = fn()
    return out, kept


def test_join_keeps_output_and_residual_not_input():
    args, r, _ = _case("batch_norm", torch.float32, "relu")
    out, kept = _saved(lambda: M.batch_norm_add(r, "relu", [], *args))
    big = {t.untyped_storage().data_ptr() for t in kept if t.numel() == out.numel()}
    assert big == {out.untyped_storage().data_ptr(), r.untyped_storage().data_ptr()}


def test_join_double_backward_raises():
    args, r, ins = _case("layer_norm", torch.float64, "none")
    out = M.layer_norm_add(r, "none", [], *args)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), args[0], create_graph=True)


@pytest.mark.parametrize("name", NORMS)
def test_join_opcheck(name):
    args, r, _ = _case(name, torch.float32, "relu")
    torch.library.opcheck(getattr(M, name + "_add").default, (r, "relu", [], *args))


POOLS = [
    ((2, 3, 17, 19), (3, 3), (2, 2), (1, 1), (1, 1), False),
    ((2, 3, 17, 19), (3, 3), (2, 2), (1, 1), (1, 1), True),
    ((1, 4, 16, 16), (2, 2), (), (0, 0), (1, 1), False),
    ((3, 15, 14), (3, 2), (1, 2), (1, 0), (2, 1), True),
    ((2, 2, 12, 12), (12, 12), (), (0,), (1,), False),
]


@pytest.mark.parametrize("case", POOLS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool2d_bitwise(case, channels_last):
    shape, k, s, p, d, c = case
    x = torch.randn(*shape)
    x.view(-1)[0] = float("nan")
    if x.dim() == 4:
        x[0, 1] = float("-inf")
        x[-1, 0, 2:5, 2:5] = float("nan")
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    ref = F.max_pool2d(x, k, s, p, d, c)
    out = M.max_pool2d(x, k, s, p, d, c)
    assert torch.equal(ref.nan_to_num(), out.nan_to_num()) and out.stride() == ref.stride()
    g = torch.randn_like(ref)
    (gr,) = torch.autograd.grad(ref, x, g)
    (go,) = torch.autograd.grad(out, x, g)
    assert torch.equal(gr, go) and gr.stride() == go.stride()


def test_max_pool2d_keeps_int8_positions_only():
    x = torch.randn(2, 8, 16, 16, requires_grad=True)
    out, kept = _saved(lambda: M.max_pool2d(x, [3, 3], [2, 2], [1, 1], [1, 1], False))
    assert [(t.dtype, t.shape) for t in kept] == [(torch.int8, out.shape)]


def test_max_pool2d_opcheck_and_compile_dynamic():
    torch.library.opcheck(
        M.max_pool2d.default,
        (torch.randn(2, 3, 9, 9, requires_grad=True), [3, 3], [2, 2], [1, 1], [1, 1], False),
    )

    def f(x):
        return M.max_pool2d(x.relu(), [3, 3], [2, 2], [1, 1], [1, 1], False).sum()

    cf = torch.compile(f, dynamic=True, backend="aot_eager")
    for n in (9, 13):
        x = torch.randn(2, 3, n, n, requires_grad=True)
        (g1,) = torch.autograd.grad(cf(x), x)
        x2 = x.detach().requires_grad_()
        (g2,) = torch.autograd.grad(F.max_pool2d(x2.relu(), 3, 2, 1).sum(), x2)
        assert torch.equal(g1, g2)


def test_join_compile_dynamic():
    def f(r, x, w, b):
        return (
            M.batch_norm_add(r, "relu", [], x, w, b, None, None, True, 0.1, 1e-5, False)
            .square()
            .sum()
        )

    cf = torch.compile(f, dynamic=True, backend="aot_eager")
    for n in (5, 7):
        ins = [
            torch.randn(2, 4, n, n, dtype=torch.float64, requires_grad=True),
            torch.randn(2, 4, n, n, dtype=torch.float64, requires_grad=True),
            torch.rand(4, dtype=torch.float64, requires_grad=True),
            torch.randn(4, dtype=torch.float64, requires_grad=True),
        ]
        got = torch.autograd.grad(cf(*ins), ins)
        want = torch.autograd.grad(
            (
                torch.relu(ins[0])
                + torch.batch_norm(ins[1], ins[2], ins[3], None, None, True, 0.1, 1e-5, False)
            )
            .square()
            .sum(),
            ins,
        )
        for a, b in zip(got, want):
            assert _rel(a, b) < 1e-10


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("act", ["none", "gelu", "silu"])
def test_join_fused_add_is_aten_bit_for_bit(name, act):
    # Another activation on contiguous CPU float: aten computes act(r), and one pass
    # of the kernels library adds it to norm(x) and takes the per-channel max |act(r)|
    # (which decides the channels that keep x_hat). The sum must be aten's bit for
    # bit, NaN, inf and -0.0 included, and the channels whose maximum is not finite
    # keep their x_hat: the input's gradient stays finite wherever aten's is. The
    # residual's gradient is aten's (gelu: to rounding, one fused pass).
    args, r, ins = _case(name, torch.float32, act, seed=11)
    with torch.no_grad():
        r.view(-1)[:6] = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), -1.0])
        r.view(-1)[-3:] = torch.tensor([-0.0, -1e30, 3e-39])
    ref, out = _both(name, args, r, act)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(), ref.nan_to_num())
    assert torch.equal(torch.signbit(out), torch.signbit(ref))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (gr_ref,) = torch.autograd.grad(ref, [r], g, retain_graph=True)
    (gr,) = torch.autograd.grad(out, [r], g, retain_graph=True)
    assert torch.equal(gr.isnan(), gr_ref.isnan())
    if act == "gelu":  # act_with_derivative: aten's formulas, one fused pass
        num = ~gr_ref.isnan()
        torch.testing.assert_close(gr[num], gr_ref[num], rtol=1e-5, atol=1e-6)
    else:
        assert torch.equal(gr.nan_to_num(), gr_ref.nan_to_num())
    gx_ref = torch.autograd.grad(ref, [ins[0]], g)[0]
    gx = torch.autograd.grad(out, [ins[0]], g)[0]
    assert torch.equal(gx.isfinite(), gx_ref.isfinite())
    # Where aten's gradient is finite the rebuild is within the norms' bound.
    fin = gx_ref.isfinite()
    assert _rel(gx[fin], gx_ref[fin]) < 1e-4


def test_join_fused_add_channel_maximum_decides_the_fallback():
    # A residual of 1e6 in one channel (|act(r)| > 64 |gamma|): that channel keeps
    # x_hat (the rebuild would lose it to rounding), the others rebuild; fp32
    # gradients stay within 1e-5 of fp64 where the rebuild alone would not.
    args, r, ins = _case("batch_norm", torch.float32, "gelu", seed=5)
    with torch.no_grad():
        r[:, 2] += 1e6
    ref64 = _case("batch_norm", torch.float64, "gelu", seed=5)
    with torch.no_grad():
        ref64[1][:, 2] += 1e6
        for a, b in zip(ref64[2], ins):
            a.copy_(b.double())
    out = M.batch_norm_add(r, "gelu", [], *args)
    want = ACTS["gelu"](ref64[1]) + torch.batch_norm(*ref64[0])
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    gx = torch.autograd.grad(out, [ins[0]], g)[0]
    gx64 = torch.autograd.grad(want, [ref64[2][0]], g.double())[0]
    assert _rel(gx, gx64) < 1e-5


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_relu_join_fused_pass_is_aten_bit_for_bit(name, dtype):
    # Contiguous CPU float / double with act = relu takes the kernels library's fused
    # pass (relu + add + the per-channel maximum; out - relu(r) in backward). Its sum
    # must be aten's relu(r) + norm(x) bit for bit, NaN, inf and -0.0 included (relu
    # is aten's clamp_min value for value), and the residual's gradient aten's exactly.
    args, r, ins = _case(name, dtype, "relu", seed=7)
    with torch.no_grad():
        r.view(-1)[:6] = torch.tensor(
            [float("nan"), -0.0, 0.0, float("inf"), -float("inf"), -1.0], dtype=dtype
        )
    ref, out = _both(name, args, r, "relu")
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(), ref.nan_to_num())
    assert torch.equal(torch.signbit(out), torch.signbit(ref))
    g = torch.randn(out.shape, dtype=dtype)
    (gr_ref,) = torch.autograd.grad(ref, [r], g, retain_graph=True)
    (gr,) = torch.autograd.grad(out, [r], g, retain_graph=True)
    assert torch.equal(gr.nan_to_num(), gr_ref.nan_to_num())
    # The channels holding NaN / inf keep their x_hat (the maximum is not finite):
    # the input's gradient stays finite wherever aten's is.
    gx_ref = torch.autograd.grad(ref, [ins[0]], g)[0]
    gx = torch.autograd.grad(out, [ins[0]], g)[0]
    assert torch.equal(gx.isfinite(), gx_ref.isfinite())
