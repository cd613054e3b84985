"""The memslim ops where aten is defined but the saved output says little.

What: gradients at non-finite and extremal inputs (NaN, +-inf, +-0, subnormals,
the largest finite values, the overflow threshold of aten's own formulas), with
non-finite grad_out, after a forward whose output overflows the dtype (elu and
celu with a large alpha or a negative input_scale), and fp64 gradcheck on a
dense sweep around each non-monotonic activation's minimum.
Why: an output-saving backward sees only (y, bit); where that loses the input
(y = NaN, y = +-inf, y underflowed to 0 for a huge |x|) it must still give
aten's gradient: NaN where aten has NaN (a NaN input that turned into a 0
gradient hid divergence), the same finite value elsewhere.
Reference: aten's autograd on the same values and dtype, through its
vectorised CPU loop (each value repeated 64 times, the path every element of a
real tensor but the tail takes). aten is not consistent with itself at a few
points, measured on torch 2.14 CPU: at a NaN input, elu / celu / selu /
hardswish give NaN gradients in the vectorised loop but the positive-branch
value in the scalar loop (and in the CUDA kernel's formula); memslim propagates
the NaN. Forward values are compared with aten's scalar loop, because the
vectorised gelu returns NaN for +inf and inf for |x| >= 1.7e38 (fp32), where
the scalar loop and memslim return inf and x.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import memslim
from memslim import _numerics as N

M = torch.ops.memslim
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# (ours, aten) per case: every op in memslim.OPS, with parameter variants that
# take other code paths (bits for softplus/elu, overflow for elu/celu).
CASES = {
    "gelu": (lambda x: M.gelu(x), F.gelu),
    "gelu_tanh": (lambda x: M.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "silu": (M.silu, F.silu),
    "mish": (M.mish, F.mish),
    "softplus": (M.softplus, F.softplus),
    "softplus_b2_t1": (lambda x: M.softplus(x, 2.0, 1.0), lambda x: F.softplus(x, 2.0, 1.0)),
    "softplus_b05": (lambda x: M.softplus(x, 0.5), lambda x: F.softplus(x, 0.5)),
    "elu": (M.elu, F.elu),
    "elu_a05_s2_i15": (
        lambda x: M.elu(x, 0.5, 2.0, 1.5),
        lambda x: torch.ops.aten.elu(x, 0.5, 2.0, 1.5),
    ),
    "elu_neg_alpha": (lambda x: M.elu(x, -0.5), lambda x: torch.ops.aten.elu(x, -0.5)),
    "elu_neg_iscale": (
        lambda x: M.elu(x, 1.0, 1.0, -0.5),
        lambda x: torch.ops.aten.elu(x, 1.0, 1.0, -0.5),
    ),
    "elu_a1e5": (lambda x: M.elu(x, 1e5), lambda x: F.elu(x, 1e5)),
    "celu": (lambda x: M.celu(x, 0.7), lambda x: F.celu(x, 0.7)),
    "celu_a1e5": (lambda x: M.celu(x, 1e5), lambda x: F.celu(x, 1e5)),
    "selu": (M.selu, F.selu),
    "leaky_relu": (M.leaky_relu, F.leaky_relu),
    "leaky_relu_0.2": (lambda x: M.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2)),
    "hardswish": (M.hardswish, F.hardswish),
    "hardsigmoid": (M.hardsigmoid, F.hardsigmoid),
    "sigmoid": (M.sigmoid, torch.sigmoid),
    "tanh": (M.tanh, torch.tanh),
    "relu": (M.relu, F.relu),
}


# Scale of the derivative where it is not O(1): elu's negative branch is
# input_scale * alpha * scale * exp(input_scale * x), and an output-saving
# backward's error is relative to that scale (the rounding of y ~ -alpha*scale).
SCALE = {"elu_a1e5": 1e5}


def test_every_public_op_has_a_case():
    assert set(memslim.OPS) <= set(CASES), set(memslim.OPS) - set(CASES)


# Finite-value tolerance (relative to max(1, |aten grad|)): the output-saving
# error bars of the README numerics table, with the 16-bit ones at 4x aten's
# own 16-bit backward error (aten is the reference here, not float64).
TOL = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def extremal_values(dtype):
    fi = torch.finfo(dtype)
    base = [
        math.nan,
        math.inf,
        -math.inf,
        0.0,
        -0.0,
        fi.tiny,
        -fi.tiny,
        fi.tiny / 4,
        -fi.tiny / 4,
        fi.max,
        -fi.max,
        fi.max / 2,
        -fi.max / 2,
        fi.eps,
        -fi.eps,
        1.0,
        -1.0,
        3.0,
        -3.0,
        10.0,
        -10.0,
        20.0,
        -20.0,
        25.0,
        -25.0,
        90.0,
        -90.0,
        1e4,
        -1e4,
        6e4,
        -6e4,
    ]
    # gelu(tanh)'s x^2 overflows (aten's backward: 0 * inf = NaN) past ~1.8e19 in
    # float compute and ~1.3e154 in double.
    for v in (1e10, 1e13, 1e18, 1e19, 2e19, 1e20, 1e30, 1e38, 1e100, 1e153, 1e155, 1e200):
        if v < fi.max:
            base += [v, -v]
    return torch.tensor(base, dtype=torch.float64).to(dtype)


def grads(fn, x, g=None):
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    y.backward(torch.ones_like(y) if g is None else g)
    return y.detach(), x.grad


def assert_like_aten(got, want, dtype, what, scale=1.0):
    """NaN exactly where aten has NaN, the same infinities, finite values close.

    One exception, the overflow threshold: a gradient within the tolerance of
    the dtype's largest value may round to inf on one side and not the other.
    """
    got, want = got.double(), want.double()

    def where(mask):
        i = mask.nonzero()[:, 0]
        return f"{i.numel()} elements, e.g. {list(zip(i[:6].tolist(), got[i[:6]].tolist(), want[i[:6]].tolist()))}"

    nan_diff = got.isnan() != want.isnan()
    assert not nan_diff.any(), (
        f"{what}: NaN pattern differs at {where(nan_diff)} (index, memslim, aten)"
    )
    inf = want.isinf() | got.isinf()
    at_threshold = torch.where(got.isinf(), want, got).abs() >= torch.finfo(dtype).max * (
        1 - TOL[dtype]
    )
    same_sign = torch.sign(got) == torch.sign(want)
    inf_diff = inf & (got != want) & ~(at_threshold & same_sign)
    assert not inf_diff.any(), (
        f"{what}: infinities differ at {where(inf_diff)} (index, memslim, aten)"
    )
    fin = ~(want.isnan() | inf)
    err = (got - want).abs()[fin] / want.abs()[fin].clamp_min(scale)
    if err.numel():
        i = fin.nonzero()[err.argmax(), 0].item()
        assert err.max() <= TOL[dtype], (
            f"{what}: max error {err.max():.3g} at index {i}: memslim {got[i].item()!r}, aten {want[i].item()!r}"
        )


def aten_vector_path(fn, x, g=None):
    """aten's (y, dL/dx) with every element of x computed in the vectorised loop."""
    r = 64
    y, gx = grads(fn, x.repeat_interleave(r), None if g is None else g.repeat_interleave(r))
    return y[::r], gx[::r]


def aten_scalar_path(fn, x):
    # One element at a time: aten's scalar loop, whose non-finite handling does
    # not depend on where the element sits in the tensor.
    return torch.stack([fn(x[i : i + 1])[0] for i in range(x.numel())])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_extremal_inputs_match_aten(name, dtype):
    ours, aten = CASES[name]
    x = extremal_values(dtype)
    with torch.no_grad():
        want_y = aten_scalar_path(aten, x)
    y1, g1 = grads(ours, x)
    _, g2 = aten_vector_path(aten, x)
    assert_like_aten(y1, want_y, dtype, f"{name} forward", SCALE.get(name, 1.0))
    assert_like_aten(g1, g2, dtype, f"{name} grad", SCALE.get(name, 1.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_nonfinite_grad_out_matches_aten(name, dtype):
    # grad_out NaN / +-inf at ordinary inputs, where f'(x) is neither 0 nor tiny.
    ours, aten = CASES[name]
    x = torch.tensor([-2.5, -1.0, -0.3, 0.25, 0.6, 1.7, 2.9] * 3, dtype=dtype)
    g = torch.tensor([math.nan] * 7 + [math.inf] * 7 + [-math.inf] * 7, dtype=dtype)
    _, g1 = grads(ours, x, g)
    _, g2 = aten_vector_path(aten, x, g)
    assert_like_aten(g1, g2, dtype, f"{name} grad_out non-finite", SCALE.get(name, 1.0))


DROPOUT_ACTS = {  # activation_dropout(act, params) -> aten activation
    "gelu": ([], F.gelu),
    "gelu_tanh": ([], lambda x: F.gelu(x, approximate="tanh")),
    "silu": ([], F.silu),
    "mish": ([], F.mish),
    "hardswish": ([], F.hardswish),
    "softplus": ([1.0, 20.0], F.softplus),
    "elu": ([1.0, 1.0, 1.0], F.elu),
    "elu_a1e5": ([1e5, 1.0, 1.0], lambda x: F.elu(x, 1e5)),
    "sigmoid": ([], torch.sigmoid),
    "tanh": ([], torch.tanh),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(DROPOUT_ACTS))
def test_activation_dropout_extremal_inputs(name, dtype):
    params, aten = DROPOUT_ACTS[name]
    act = name.split("_a1e5")[0]
    x = extremal_values(dtype).repeat_interleave(64)  # aten's vectorised loop, see above

    def ours(t):
        return M.activation_dropout(t, act, params, 0.3, True)

    def ref(t):
        return F.dropout(aten(t), 0.3, True)

    torch.manual_seed(5)
    y1, g1 = grads(ours, x)
    torch.manual_seed(5)
    y2, g2 = grads(ref, x)
    torch.manual_seed(5)
    kept = F.dropout(torch.ones_like(x), 0.3, True) != 0
    # Known difference: a dropped element whose activation output is +-inf
    # (out = inf * 0 = NaN, in aten too) may get a NaN gradient where aten's
    # derivative is finite (elu, softplus, hardswish at x = +inf): the saved
    # NaN no longer says whether y was inf or NaN. The loss is NaN there anyway.
    with torch.no_grad():
        act_out = aten(x)
    _, d_aten = aten_vector_path(aten, x)
    known = ~kept & act_out.isinf() & d_aten.isfinite() & g1.isnan()
    g2 = torch.where(known, g1, g2)
    assert_like_aten(g1, g2, dtype, f"activation_dropout {name} grad", SCALE.get(name, 1.0) / 0.7)
    if name == "gelu":  # aten's vectorised gelu at +inf and |x| >= 1.7e38, see above
        y2 = torch.where((x == math.inf) | (x.double().abs() >= 1.7e38), y1, y2)
    assert_like_aten(
        y1, y2, dtype, f"activation_dropout {name} forward", SCALE.get(name, 1.0) / 0.7
    )


@pytest.mark.parametrize(
    "name", ["gelu", "silu", "mish", "gelu_tanh", "softplus", "elu", "elu_a1e5"]
)
def test_activation_dropout_fp16_scaled_output_overflow(name):
    # Kept elements whose output y overflows fp16 once scaled by 1/(1-p)
    # (y > 45853 at p = 0.3): the saved out is inf, the derivative finite.
    params, aten = DROPOUT_ACTS[name]
    act = name.split("_a1e5")[0]
    x = torch.tensor(
        [45000.0, 46000.0, 50000.0, 65504.0, 1.0, -1.0, 30000.0, -0.5] * 64, dtype=torch.float16
    )
    torch.manual_seed(3)
    y1, g1 = grads(lambda t: M.activation_dropout(t, act, params, 0.3, True), x)
    torch.manual_seed(3)
    y2, g2 = grads(lambda t: F.dropout(aten(t), 0.3, True), x)
    assert y2.isinf().any()
    assert_like_aten(
        y1, y2, torch.float16, f"activation_dropout {name} forward", SCALE.get(name, 1.0)
    )
    assert_like_aten(
        g1, g2, torch.float16, f"activation_dropout {name} grad", SCALE.get(name, 1.0) / 0.7
    )


# fp16 / bf16: every finite value, elu family with parameters whose forward
# overflows the dtype while aten's gradient (computed in float) stays finite.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["elu_a1e5", "celu_a1e5", "elu_neg_iscale", "elu", "celu", "selu"])
def test_16bit_elu_overflow_matches_aten(name, dtype):
    ours, aten = CASES[name]
    x = N.all_values(dtype, -1e39, 1e39)
    _, g1 = grads(ours, x)
    _, g2 = aten_vector_path(aten, x)
    assert_like_aten(g1, g2, dtype, f"{name} all {dtype} values", SCALE.get(name, 1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_elu_overflow_wide_dtypes(dtype):
    # The same in fp32 / fp64, where alpha * scale beyond the dtype's max or a
    # negative input_scale overflow the forward.
    # (alpha * scale beyond the max; each one alone must fit the dtype for aten.)
    alpha, scale_ = (1e38, 10.0) if dtype == torch.float32 else (1e308, 10.0)
    x = torch.tensor([-1e-3, -0.5, -1.0, -5.0, -50.0, -700.0, -1e4, 0.5], dtype=dtype)
    for ours, aten, scale in [
        (
            lambda t: M.elu(t, alpha, scale_),
            lambda t: torch.ops.aten.elu(t, alpha, scale_),
            alpha * scale_,
        ),
        (lambda t: M.elu(t, 1.0, 1.0, -2.0), lambda t: torch.ops.aten.elu(t, 1.0, 1.0, -2.0), 2.0),
    ]:
        _, g1 = grads(ours, x)
        _, g2 = aten_vector_path(aten, x)
        assert_like_aten(g1, g2, dtype, "elu overflow", scale)


# fp64 gradcheck around each minimum. gradcheck's criterion on an elementwise
# op is |analytical - numerical| <= atol + rtol |numerical| per element with
# the numerical derivative a central difference (eps = 1e-6); the dense sweep
# applies exactly that to 200k points, torch.autograd.gradcheck runs on a
# slice of them and at the extremal values.
MINIMA = {
    "gelu": (lambda x: M.gelu(x), -0.75179152469356445747),
    "gelu_tanh": (lambda x: M.gelu(x, "tanh"), -0.75246142207101625849),
    "silu": (M.silu, -1.2784645427610737951),
    "mish": (M.mish, -1.1924312145154952121),
    "hardswish": (M.hardswish, -1.5),
    "softplus_b2_t1": (lambda x: M.softplus(x, 2.0, 1.0), None),
}


def sweep_around(x_min):
    u = torch.logspace(-9, 0, 50_000, dtype=torch.float64)
    lin = torch.linspace(-3e-4, 3e-4, 50_001, dtype=torch.float64)
    return torch.cat([x_min + u, x_min - u, x_min + lin]), torch.cat([u, u, lin.abs()])


@pytest.mark.parametrize("name", sorted(MINIMA))
def test_fp64_dense_gradcheck_around_minimum(name):
    fn, x_min = MINIMA[name]
    if x_min is None:  # monotonic: a sweep across the linear-region switch instead
        x = torch.linspace(-5, 5, 100_001, dtype=torch.float64)
        x = x[((2 * x) - 1).abs() > 1e-5]  # not at the threshold's jump (aten's too)
    else:
        x, _ = sweep_around(x_min)
    eps = 1e-6
    with torch.no_grad():
        num = (fn(x + eps) - fn(x - eps)) / (2 * eps)
    _, ana = grads(fn, x)
    bad = (ana - num).abs() > 1e-5 + 1e-3 * num.abs()
    assert not bad.any(), (
        f"{int(bad.sum())} of {x.numel()} points fail gradcheck's criterion, first at "
        f"x = {x[bad][0].item()!r}: analytical {ana[bad][0].item():.6e}, numerical {num[bad][0].item():.6e}"
    )
    # And closer than gradcheck requires: against aten's fp64 backward.
    aten = {
        "gelu": F.gelu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "silu": F.silu,
        "mish": F.mish,
        "hardswish": F.hardswish,
        "softplus_b2_t1": lambda t: F.softplus(t, 2.0, 1.0),
    }[name]
    _, ref = grads(aten, x)
    assert (ana - ref).abs().max() < 1e-9


@pytest.mark.parametrize("name", sorted(MINIMA))
def test_fp64_gradcheck_near_minimum_and_extremal(name):
    fn, x_min = MINIMA[name]
    if x_min is not None:
        u = torch.tensor(
            [
                0.0,
                1e-9,
                1e-7,
                5e-7,
                1e-6,
                1.0001e-6,
                2e-6,
                5e-6,
                1e-5,
                2e-5,
                3e-5,
                5e-5,
                1e-4,
                3e-4,
                1e-3,
                1e-2,
            ],
            dtype=torch.float64,
        )
        x = torch.cat([x_min + u, x_min - u])
    else:
        x = torch.linspace(-4, 4, 64, dtype=torch.float64)
    # Extremal finite values (away from hardswish's kinks at +-3, where aten's
    # own gradcheck fails).
    # (Not beyond ~1e9: x +- 1e-6 rounds to x there, for aten's op as for ours.)
    x = torch.cat(
        [
            x,
            torch.tensor(
                [-700.0, -40.0, -12.0, -5.0, 5.0, 12.0, 40.0, 1e4, -1e4], dtype=torch.float64
            ),
        ]
    )
    assert torch.autograd.gradcheck(fn, (x.requires_grad_(),))
