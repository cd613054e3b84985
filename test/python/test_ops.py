"""The memslim activation ops against aten: values, gradients, layouts, modes, errors."""

import pytest
import torch

import memslim
from memslim import _numerics as N

M = torch.ops.memslim
CASES = sorted(N.CASES)


def grads(fn, x, g):
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    y.backward(g)
    return y.detach(), x.grad


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_and_grad_match_aten(name, dtype):
    c = N.CASES[name]
    x = torch.randn(4096, dtype=dtype) * 3
    g = torch.randn_like(x)
    y1, g1 = grads(c.ours, x, g)
    y2, g2 = grads(c.aten, x, g)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(y1, y2, rtol=tol * 10, atol=tol)
    # Gradient error relative to |grad_out|. fp64 bar: 1e-7, because aten's own
    # fp64 celu backward is off by 1.7e-8 at x = -4e-4 (checked with mpmath:
    # exp(x/0.7) = 0.99943105364682, memslim gives ...682, aten ...706).
    assert ((g1 - g2).abs() / g.abs().clamp_min(1e-30)).max() < (
        1e-4 if dtype == torch.float32 else 1e-7
    )


# The left tails, where the output is tiny: memslim's forward is as accurate as
# aten's, and its gradient within 1e-6, on vectors long enough for every lane
# width of the CPU loops. The
# AVX-512 build's auto-vectorised libm calls once went to libmvec's 16-lane erff,
# which rounds erf(-3.65) to -1: gelu(-5.17) was -0 where aten gives -6.2e-7, and
# the derivative recovered from it 0 where aten's is -3.2e-6.
@pytest.mark.parametrize(
    "name,lo,hi",
    [("gelu", -5.6, -4.0), ("gelu_tanh", -5.0, -3.0), ("silu", -30.0, -8.0), ("mish", -30.0, -8.0)],
)
def test_left_tail_is_relative_accurate(name, lo, hi):
    c = N.CASES[name]
    x = torch.linspace(lo, hi, 4099)
    g = torch.ones_like(x)
    y1, g1 = grads(c.ours, x, g)
    y2, g2 = grads(c.aten, x, g)
    yr, gr = grads(c.aten, x.double(), g.double())
    # aten's float formula cancels there too (gelu: 1 + erf(x / sqrt 2)); libm's erf
    # quantizes it differently from aten's, so the bound is aten's error plus 2e-7.
    assert (y1.double() - yr).abs().max() <= (y2.double() - yr).abs().max() + 2e-7
    # Where aten's own float output has cancelled to 0 (gelu below -5.5) no
    # output-saving backward can recover f' (|f'| < 1e-6 there): absolute error.
    assert (g1.double() - gr).abs().max() <= 1e-6


@pytest.mark.parametrize("name", CASES)
def test_gradcheck_fp64(name):
    x = torch.randn(48, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(N.CASES[name].ours, (x,))


@pytest.mark.parametrize(
    "name", ["gelu", "silu", "hardswish", "elu", "relu", "leaky_relu", "sigmoid"]
)
def test_layouts(name):
    c = N.CASES[name]
    base = torch.randn(4, 6, 5, 7)
    inputs = {
        "channels_last": base.to(memory_format=torch.channels_last),
        "strided": base[:, ::2, :, 1:],
        "transposed": base.transpose(1, 3),
        "transposed_slice": base[:, :, :, 1:].transpose(1, 3),  # not dense
        "empty": torch.randn(0, 3),
        "scalar": torch.tensor(-0.7),
    }
    for label, x in inputs.items():
        g = torch.randn_like(x)
        # grad in a different layout from the output: the backward conforms it.
        if label == "channels_last":
            g = g.contiguous()
        y1, g1 = grads(c.ours, x, g)
        y2, g2 = grads(c.aten, x, g)
        torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-6, msg=label)
        # fp32 output-saving error is up to 4.5e-5 of |grad_out| (README table).
        torch.testing.assert_close(
            g1, g2, rtol=1e-4, atol=1e-4 * float(g.abs().amax()) if g.numel() else 0.0, msg=label
        )
        assert y1.shape == y2.shape, label
        # aten's layout (TensorIterator keeps the stride order): a dropout drawn over
        # the output's memory order then draws aten's mask (long-fuzz seed 124836)
        assert y1.stride() == y2.stride(), (label, y1.stride(), y2.stride())
        if label == "channels_last":
            assert y1.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("name", ["gelu", "relu", "elu"])
def test_no_grad_paths_save_nothing(name):
    c = N.CASES[name]
    x = torch.randn(256, 256)
    assert memslim.saved_bytes(c.ours, x) == 0  # input does not require grad
    xr = x.clone().requires_grad_(True)
    with torch.no_grad():
        assert not c.ours(xr).requires_grad
    with torch.inference_mode():
        y = c.ours(xr)
        assert not y.requires_grad
        torch.testing.assert_close(y, c.aten(x))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_dtype_is_a_clear_error(dtype):
    x = torch.ones(4, dtype=dtype)
    with pytest.raises(RuntimeError, match="memslim::gelu: expected a floating-point tensor"):
        M.gelu(x)
    with pytest.raises(RuntimeError, match="memslim::leaky_relu: expected a floating-point tensor"):
        M.leaky_relu(x)


def test_bad_approximate_is_a_clear_error():
    with pytest.raises(RuntimeError, match="approximate argument must be either none or tanh"):
        M.gelu(torch.randn(3), "erf")


def test_double_backward_is_a_clear_error():
    x = torch.randn(16, requires_grad=True)
    y = M.gelu(x)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


def test_16bit_grads_track_aten():
    for dtype in (torch.float16, torch.bfloat16):
        for name in CASES:
            c = N.CASES[name]
            x = torch.randn(2048).to(dtype)
            g = torch.ones_like(x)
            _, g1 = grads(c.ours, x, g)
            _, g2 = grads(c.aten, x, g)
            # Away from the guard band both round the same f' to 16 bits.
            assert (g1.float() - g2.float()).abs().max() < 2e-2, (name, dtype)


def test_exact_list_holds_exactly_the_band():
    # fp32 band is 2e-3 around x*; every band element is listed once with its input.
    x = torch.linspace(-3, 3, 100_001)
    for name, act in [
        ("gelu", "gelu"),
        ("silu", "silu"),
        ("mish", "mish"),
        ("hardswish", "hardswish"),
    ]:
        xs = N.CASES[name].x_min
        y, bits, idx, val = M.activation_forward(x, act, [], True)
        expect = ((x - xs).abs() < 2e-3).nonzero().flatten()
        assert torch.equal(idx.long().sort().values, expect), name
        assert torch.equal(val[idx.long().argsort()], x[expect]), name
        assert bits.numel() == (x.numel() + 7) // 8
        branch = torch.tensor([(int(b) >> j) & 1 for b in bits.tolist() for j in range(8)])[
            : x.numel()
        ]
        ref_branch = (x < -1.5) if name == "hardswish" else (x >= xs)
        assert torch.equal(branch.bool(), ref_branch), name


@pytest.mark.parametrize("name", ["gelu", "relu", "elu", "softplus"])
def test_meta_tensors(name):
    c = N.CASES[name]
    x = torch.empty(4, 5, device="meta", requires_grad=True)
    y = c.ours(x)
    assert y.device.type == "meta" and y.shape == x.shape and y.requires_grad
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize(
    "act,aten,params",
    [
        ("gelu", lambda t: torch.nn.functional.gelu(t), []),
        ("gelu_tanh", lambda t: torch.nn.functional.gelu(t, approximate="tanh"), []),
        ("silu", torch.nn.functional.silu, []),
        ("elu", torch.nn.functional.elu, [1.0, 1.0, 1.0]),
        ("sigmoid", torch.sigmoid, []),
    ],
)
def test_activation_dropout_matches_aten_pair(act, aten, params):
    x = torch.randn(64, 256, requires_grad=True)
    g = torch.randn(64, 256)
    torch.manual_seed(5)
    y1, g1 = grads(lambda t: M.activation_dropout(t, act, params, 0.1, True), x, g)
    torch.manual_seed(5)
    y2, g2 = grads(lambda t: torch.nn.functional.dropout(aten(t), 0.1, True), x, g)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=2e-6)  # same dropout mask, same values
    assert float((g1 - g2).abs().max()) <= 1e-4 * float(g.abs().max())
    lin = torch.nn.Linear(256, 256)
    # Saved bytes beside a consumer that keeps the output: output + 2 bits (+ exact list)
    # against aten's input + float noise.
    ours = memslim.saved_bytes(lambda t: lin(M.activation_dropout(t, act, params, 0.1, True)), x)
    ref = memslim.saved_bytes(lambda t: lin(torch.nn.functional.dropout(aten(t), 0.1, True)), x)
    w = lin.weight.numel() * 4  # the lambda is not a module: its weight counts in both
    n = x.numel()
    assert ref - w >= 3 * 4 * n - 4 * n  # input + noise (+ output kept by the linear)
    assert ours - w <= 4 * n + 2 * (n // 8) + 4 * n // 100


def test_activation_dropout_eval_and_no_grad():
    x = torch.randn(32, 16)
    torch.testing.assert_close(
        M.activation_dropout(x, "gelu", [], 0.5, False), torch.nn.functional.gelu(x)
    )
    with torch.no_grad():
        torch.manual_seed(3)
        a = M.activation_dropout(x, "gelu", [], 0.5, True)
        torch.manual_seed(3)
        b = torch.nn.functional.dropout(torch.nn.functional.gelu(x), 0.5, True)
    torch.testing.assert_close(a, b)
    with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
        M.activation_dropout(x, "gelu", [], 1.5, True)


def test_activation_dropout_checks_its_parameter_count():
    """A missing parameter was read as 0: elu with [1.0] (scale 0) returned zeros."""
    x = torch.randn(16)
    with pytest.raises(
        RuntimeError, match=r"'elu' takes 3 parameters \(alpha, scale, input_scale\), got 1"
    ):
        M.activation_dropout(x, "elu", [1.0], 0.1, True)
    with pytest.raises(RuntimeError, match="'gelu' takes 0 parameters"):
        M.activation_dropout(x, "gelu", [3.0], 0.1, True)
    with pytest.raises(RuntimeError, match="unknown activation 'nope'"):
        M.activation_dropout(x, "nope", [], 0.1, True)
    torch.testing.assert_close(
        M.activation_dropout(x, "softplus", [2.0, 20.0], 0.0, True),
        torch.nn.functional.softplus(x, 2.0, 20.0),
    )


@pytest.mark.parametrize("n", [1, 7, 9, 31, 33, 255, 257, 511, 513, 1000, 4103, 70001])
def test_packed_bits_at_every_tail_length(n):
    # The CPU forward packs 32 flags at a time (AVX2) and the rest 8 at a time, per
    # 512-element chunk: relu's gradient is its bit alone, so any misplaced bit shows.
    torch.manual_seed(n)
    x = torch.randn(n)
    for name in ("relu", "gelu"):
        xa = x.clone().requires_grad_(True)
        xm = x.clone().requires_grad_(True)
        g = torch.randn(n)
        getattr(torch.nn.functional, name)(xa).backward(g)
        getattr(M, name)(xm).backward(g)
        if name == "relu":
            assert torch.equal(xm.grad, xa.grad)
        else:  # a bit on the wrong branch of the inversion would be off by O(1)
            torch.testing.assert_close(xm.grad, xa.grad, rtol=1e-3, atol=1e-4)
