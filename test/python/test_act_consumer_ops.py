"""memslim::act_linear / act_conv*d against aten: linear/conv of act(h), keeping h.

What: for every kernel activation and each consumer (linear, conv1d/2d/3d:
strides, padding, dilation, groups, channels_last, no bias), values and all
gradients equal aten's bit for bit (the same aten ops on the same values, act(h)
recomputed), but gelu's gradients on dense fp32 / fp64 CPU tensors: there the
backward recomputes gelu and its derivative in one pass of the kernels library
(act_with_derivative), aten's formulas (fp32: its erf form), held to aten's own
error against fp64; saved bytes hold h, not act(h); opcheck; torch.compile with
dynamic shapes; double backward raises. Under CPU bf16 autocast (backward outside
it): aten's output bit for bit, gradients within twice aten bf16's distance to fp64,
h kept instead of autocast's bf16 copy of act(h), opcheck, float64 h refused as aten
refuses it.
"""

import pytest
import torch
import torch.nn.functional as F

import memslim  # noqa: F401  (registers torch.ops.memslim)

M = torch.ops.memslim

# kernel activation name -> (aten form, params)
ACTS = {
    "gelu": (F.gelu, []),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), []),
    "silu": (F.silu, []),
    "mish": (F.mish, []),
    "hardswish": (F.hardswish, []),
    "hardsigmoid": (F.hardsigmoid, []),
    "sigmoid": (torch.sigmoid, []),
    "tanh": (torch.tanh, []),
    "relu": (F.relu, []),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), [0.2]),
    "softplus": (lambda x: F.softplus(x, 2.0, 5.0), [2.0, 5.0]),
    "elu": (lambda x: F.elu(x, 0.5), [0.5, 1.0, 1.0]),
}


def _all(f, *ts, dtype=None):
    ins = [t.detach().clone().to(dtype or t.dtype).requires_grad_(True) for t in ts]
    y = f(*ins)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=ts[0].dtype)
    return [y.detach(), *torch.autograd.grad(y, ins, g.to(y.dtype))]


def _same(a, b):
    for u, v in zip(a, b):
        assert torch.equal(u, v), (u - v).abs().max()


# Activations whose backward recompute runs act_with_derivative on plain CPU floats.
FUSED_DERIVATIVE = {"gelu"}


def _check(act, aten_fn, ours_fn, *ts):
    want, got = _all(aten_fn, *ts), _all(ours_fn, *ts)
    if act not in FUSED_DERIVATIVE:
        return _same(want, got)
    # The value is aten's gelu (the forward is unchanged); each gradient's error
    # against fp64 within twice aten's own plus 8 units of the dtype.
    assert torch.equal(got[0], want[0])
    ref = _all(aten_fn, *ts, dtype=torch.float64)
    eps = torch.finfo(ts[0].dtype).eps
    for r, a, m in zip(ref[1:], want[1:], got[1:]):
        scale = r.abs().max().clamp_min(1e-30)
        ea = ((a.double() - r).abs().max() / scale).item()
        em = ((m.double() - r).abs().max() / scale).item()
        assert em <= 2 * ea + 8 * eps, (em, ea)


@pytest.mark.parametrize("act", sorted(ACTS))
def test_linear_equals_aten(act):
    f, params = ACTS[act]
    h = torch.randn(3, 5, 16) * 2
    h.view(-1)[:4] = torch.tensor([0.0, -0.0, 3.0, -3.0])  # branch edges
    w, b = torch.randn(12, 16), torch.randn(12)
    _check(
        act,
        lambda x, w, b: F.linear(f(x), w, b),
        lambda x, w, b: M.act_linear(x, w, b, act, params),
        h,
        w,
        b,
    )
    _check(
        act,
        lambda x, w: F.linear(f(x), w),
        lambda x, w: M.act_linear(x, w, None, act, params),
        h,
        w,
    )


CONVS = [  # (aten conv, memslim op, input, weight, stride, padding, dilation, groups)
    (F.conv1d, M.act_conv1d, (2, 4, 11), (6, 4, 3), [2], [1], [1], 1),
    (F.conv2d, M.act_conv2d, (2, 4, 9, 9), (6, 4, 3, 3), [2, 1], [1, 0], [1, 2], 1),
    (F.conv2d, M.act_conv2d, (2, 4, 9, 9), (4, 1, 3, 3), [1, 1], [1, 1], [1, 1], 4),
    (F.conv3d, M.act_conv3d, (1, 2, 5, 6, 6), (3, 2, 3, 3, 3), [1, 1, 1], [1, 1, 1], [1, 1, 1], 1),
]


@pytest.mark.parametrize("act", ["relu", "silu", "gelu", "hardswish", "sigmoid"])
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_conv_equals_aten(act, case):
    conv, op, xs, ws, s, p, d, g = CONVS[case]
    f, params = ACTS[act]
    x, w, b = torch.randn(xs), torch.randn(ws), torch.randn(ws[0])
    _check(
        act,
        lambda x, w, b: conv(f(x), w, b, s, p, d, g),
        lambda x, w, b: op(x, w, b, s, p, d, g, act, params),
        x,
        w,
        b,
    )
    if len(xs) == 4:  # channels_last input
        xc = x.to(memory_format=torch.channels_last)
        _check(
            act,
            lambda x, w: conv(f(x), w, None, s, p, d, g),
            lambda x, w: op(x, w, None, s, p, d, g, act, params),
            xc,
            w,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gelu_fused_derivative_special_values(dtype):
    # The fused recompute's derivative at NaN, +-inf, +-0, subnormals, the left tail
    # and huge inputs: aten's NaN pattern (gelu'(+-inf) is 0 * inf = NaN in aten's
    # formula too), finite values within aten's own error against fp64 (_check).
    h = torch.tensor(
        [
            float("nan"),
            float("inf"),
            -float("inf"),
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            -5.2,
            -10.0,
            -20.0,
            9.0,
            1e20,
            -1e20,
            0.5,
            -0.5,
            3.0,
        ],
        dtype=dtype,
    )
    h = torch.cat(
        [h, torch.randn(48, generator=torch.Generator().manual_seed(2), dtype=dtype) * 4]
    ).reshape(4, 16)
    w = torch.eye(16, dtype=dtype) + 0.1
    ours = _all(lambda x, w: M.act_linear(x, w, None, "gelu", []), h, w)
    want = _all(lambda x, w: F.linear(F.gelu(x), w), h, w)
    for u, v in zip(ours, want):
        assert torch.equal(u.isnan(), v.isnan())
    num = ~want[1].isnan().any(1)  # rows without a NaN input (a NaN spreads to w's grad)
    _check(
        "gelu",
        lambda x, w: F.linear(F.gelu(x), w),
        lambda x, w: M.act_linear(x, w, None, "gelu", []),
        h[num],
        w,
    )


def test_keeps_input_not_activation_output():
    h = torch.randn(64, 32, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(16, 32))
    aten = memslim.saved_bytes(lambda t: F.linear(F.relu(t), w), h)
    ours = memslim.saved_bytes(lambda t: M.act_linear(t, w, None, "relu", []), h)
    # aten: relu's output (kept by relu and linear alike); ours: h. Same bytes,
    # and with h kept anyway (gelu keeps it) ours frees the output:
    assert aten == ours
    aten = memslim.saved_bytes(lambda t: F.linear(F.gelu(t), w), h)
    ours = memslim.saved_bytes(lambda t: M.act_linear(t, w, None, "gelu", []), h)
    assert aten - ours == 64 * 32 * 4


def test_opcheck():
    x, w, b = (
        torch.randn(2, 4, 7, 7, requires_grad=True),
        torch.randn(3, 4, 3, 3, requires_grad=True),
        torch.randn(3, requires_grad=True),
    )
    torch.library.opcheck(M.act_conv2d, (x, w, b, [1, 1], [1, 1], [1, 1], 1, "silu", []))
    h, lw = torch.randn(5, 8, requires_grad=True), torch.randn(6, 8, requires_grad=True)
    torch.library.opcheck(M.act_linear, (h, lw, None, "gelu_tanh", []))


def test_compile_dynamic_shapes():
    w = torch.randn(6, 8)

    def f(h):
        return M.act_linear(h, w, None, "silu", []).sin()

    cf = torch.compile(f, dynamic=True, backend="aot_eager", fullgraph=True)
    for n in (3, 9):
        h = torch.randn(n, 8)
        a = _all(lambda t: f(t), h)
        c = _all(lambda t: cf(t), h)
        for u, v in zip(a, c):
            torch.testing.assert_close(v, u, rtol=1e-6, atol=1e-6)


def test_double_backward_raises():
    h = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    y = M.act_linear(h, torch.randn(3, 8, dtype=torch.float64), None, "gelu", [])
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(y.sum(), h, create_graph=True)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


# (consumer, aten form of consumer(act(h)), op call, h's shape, w's shape)
_AUTOCAST_CONSUMERS = {
    "linear": (F.linear, lambda h, w, b, a, p: M.act_linear(h, w, b, a, p), (16, 32), (8, 32)),
    "conv2d": (
        lambda x, w, b: F.conv2d(x, w, b, 1, 1),
        lambda h, w, b, a, p: M.act_conv2d(h, w, b, [1, 1], [1, 1], [1, 1], 1, a, p),
        (2, 4, 6, 6),
        (3, 4, 3, 3),
    ),
    "conv1d": (
        lambda x, w, b: F.conv1d(x, w, b, 2),
        lambda h, w, b, a, p: M.act_conv1d(h, w, b, [2], [0], [1], 1, a, p),
        (2, 4, 9),
        (3, 4, 3),
    ),
}


@pytest.mark.parametrize("consumer", sorted(_AUTOCAST_CONSUMERS))
@pytest.mark.parametrize("act", ["gelu", "silu", "relu", "softplus"])
@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
def test_under_autocast_as_aten_runs_it(consumer, act, h_dtype):
    """Under CPU bf16 autocast, backward outside it (as training loops run it): the
    op computes act(h) in h's dtype and the consumer in bf16 (autocast's casts of its
    input, weight and bias), as aten's consumer(act(h)) does under autocast: the same
    output (dtype and values), and gradients of h's, the weight's and the bias's dtype
    within twice aten bf16's own distance to a float64 run of the same step."""
    aten_c, ours_c, hs, ws = _AUTOCAST_CONSUMERS[consumer]
    f, params = ACTS[act]
    g = torch.Generator().manual_seed(0)
    h0, w0, b0 = torch.randn(hs, generator=g), torch.randn(ws, generator=g), torch.randn(ws[0])
    h0 = h0.to(h_dtype)

    def step(fn, dtype=None, autocast=True):
        ins = [t.detach().to(dtype or t.dtype).requires_grad_(True) for t in (h0, w0, b0)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = fn(*ins)
        (y.double().sin().sum()).backward()
        return y, [t.grad for t in ins]

    ref_y, ref_g = step(lambda h, w, b: aten_c(f(h), w, b), torch.float64, autocast=False)
    aten_y, aten_g = step(lambda h, w, b: aten_c(f(h), w, b))
    ours_y, ours_g = step(lambda h, w, b: ours_c(h, w, b, act, params))
    assert ours_y.dtype == aten_y.dtype == torch.bfloat16
    torch.testing.assert_close(ours_y, aten_y, rtol=0, atol=0)
    for name, o, a, r in zip("hwb", ours_g, aten_g, ref_g):
        assert o.dtype == a.dtype, name
        bar = max(2 * _rel(a, r), 2**-10)
        assert _rel(o, r) <= bar, (name, _rel(o, r), _rel(a, r))


def test_under_autocast_keeps_h_not_the_bf16_copy_of_act_h():
    """aten keeps h (silu's input) and autocast's bf16 copy of silu(h) (the linear's
    input); the op keeps h and recomputes the copy in backward."""
    h = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(16, 32, requires_grad=True)

    def run(fn):
        def go(t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(t)

        return memslim.saved_bytes(go, h)

    aten = run(lambda t: F.linear(F.silu(t), w))
    ours = run(lambda t: M.act_linear(t, w, None, "silu", []))
    assert aten - ours == 64 * 32 * 2, (aten, ours)


def test_opcheck_under_autocast():
    x, w, b = (
        torch.randn(2, 4, 7, 7, requires_grad=True),
        torch.randn(3, 4, 3, 3, requires_grad=True),
        torch.randn(3, requires_grad=True),
    )
    h, lw = torch.randn(5, 8, requires_grad=True), torch.randn(6, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.library.opcheck(M.act_conv2d, (x, w, b, [1, 1], [1, 1], [1, 1], 1, "silu", []))
        torch.library.opcheck(M.act_linear, (h, lw, None, "gelu_tanh", []))
        torch.library.opcheck(M.act_linear, (h.bfloat16(), lw, None, "gelu", []))


def test_under_autocast_a_float64_input_meets_a_bf16_weight_as_aten_does():
    """Autocast leaves float64 alone and casts the float32 weight: aten's linear then
    raises on the mixed dtypes, and so does the op (it does not cast the float64 h)."""
    h = torch.randn(4, 8, dtype=torch.float64)
    w = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError):
            F.linear(F.gelu(h), w)
        with pytest.raises(RuntimeError, match="autocast casts neither"):
            M.act_linear(h, w, None, "gelu", [])
