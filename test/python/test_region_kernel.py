"""The fused CPU loop of memslim::recompute_region (runtime/region_kernel.cpp, issue 13).

Each case is a region graph run twice on the same inputs: with the loop (the default
for contiguous fp32 CPU inputs of one shape) and with MEMSLIM_REGION_KERNEL=0 (the
interpreter: aten's ops, eager's numbers). Values and gradients must agree to a few
units in the last place, with NaN / inf where aten has them; inputs the loop does not
take (broadcasting, fp64, strides) must give the interpreter's results bit for bit.
"""

import copy

import pytest
import torch

import memslim
from test_optimize import assert_training_error_like_eager

SPECIALS = [
    0.0,
    -0.0,
    float("inf"),
    -float("inf"),
    float("nan"),
    1e-30,
    -1e-30,
    1e30,
    -1e30,
    1.0,
    -1.0,
    0.5,
    2.0,
    -2.0,
    88.0,
    -88.0,
    1e-42,
]


def _ir(body: str, inputs: str = "%x : Tensor, %s : Tensor", outs: str = "%y") -> str:
    return (
        f"graph({inputs}):\n  %one : int = prim::Constant[value=1]()\n"
        f"  %half : float = prim::Constant[value=0.5]()\n"
        f"  %two : float = prim::Constant[value=2.]()\n"
        f"  %none : NoneType = prim::Constant()\n{body}\n  return ({outs})"
    )


# (name, body, scalar input value or None for a full-size second input, x's range)
CASES = [
    ("add", "  %y : Tensor = aten::add(%x, %s, %one)", None, 3),
    ("sub_scalar_tensor", "  %y : Tensor = aten::sub(%x, %s, %one)", 0.7, 3),
    ("rsub", "  %y : Tensor = aten::rsub(%x, %s, %one)", 0.7, 3),
    ("mul", "  %y : Tensor = aten::mul(%x, %s)", None, 3),
    ("div", "  %y : Tensor = aten::div(%x, %s)", None, 3),
    ("div_scalar", "  %y : Tensor = aten::div(%x, %s)", -1.5, 3),
    ("pow_tensor_scalar_tensor", "  %y : Tensor = aten::pow(%x, %s)", 1.3, 3),
    ("pow_full_full", "  %y : Tensor = aten::pow(%x, %s)", None, 3),
    ("pow_const_half", "  %y : Tensor = aten::pow(%x, %half)", 1.0, 3),
    ("pow_const_two", "  %y : Tensor = aten::pow(%x, %two)", 1.0, 3),
    (
        "pow_const_other",
        "  %c : float = prim::Constant[value=1.7]()\n  %y : Tensor = aten::pow(%x, %c)",
        1.0,
        3,
    ),
    ("pow_number_base", "  %y : Tensor = aten::pow(%two, %x)", 1.0, 3),
    ("square", "  %y : Tensor = aten::square(%x)", 1.0, 3),
    ("exp_log", "  %e : Tensor = aten::exp(%x)\n  %y : Tensor = aten::log(%e)", 1.0, 3),
    ("log", "  %y : Tensor = aten::log(%x)", 1.0, 3),
    (
        "sigmoid_tanh",
        "  %a : Tensor = aten::sigmoid(%x)\n  %b : Tensor = aten::tanh(%x)\n"
        "  %y : Tensor = aten::mul(%a, %b)",
        1.0,
        6,
    ),
    (
        "sqrt_rsqrt",
        "  %a : Tensor = aten::sqrt(%x)\n  %b : Tensor = aten::rsqrt(%x)\n"
        "  %y : Tensor = aten::add(%a, %b, %one)",
        1.0,
        3,
    ),
    (
        "reciprocal_neg",
        "  %a : Tensor = aten::reciprocal(%x)\n  %y : Tensor = aten::neg(%a)",
        1.0,
        3,
    ),
    (
        "expm1_log1p",
        "  %a : Tensor = aten::expm1(%x)\n  %b : Tensor = aten::log1p(%x)\n"
        "  %y : Tensor = aten::sub(%a, %b, %one)",
        1.0,
        3,
    ),
    ("relu", "  %y : Tensor = aten::relu(%x)", 1.0, 3),
    (
        "clamp",
        "  %m : float = prim::Constant[value=-0.5]()\n  %y : Tensor = aten::clamp(%x, %m, %half)",
        1.0,
        3,
    ),
    ("clamp_lo_above_hi", "  %y : Tensor = aten::clamp(%x, %two, %half)", 1.0, 3),
    (
        "clamp_min_max",
        "  %m : float = prim::Constant[value=-0.5]()\n"
        "  %a : Tensor = aten::clamp_min(%x, %m)\n"
        "  %y : Tensor = aten::clamp_max(%a, %half)",
        1.0,
        3,
    ),
    ("clamp_tensor_bound", "  %y : Tensor = aten::clamp_min(%x, %s)", 0.5, 3),  # interpreter
    (
        "where_compare",
        "  %c : Tensor = aten::gt(%x, %s)\n  %e : Tensor = aten::exp(%x)\n"
        "  %y : Tensor = aten::where(%c, %x, %e)",
        0.25,
        3,
    ),
    (
        "where_scalar_other",
        "  %c : Tensor = aten::le(%x, %half)\n  %y : Tensor = aten::where(%c, %x, %two)",
        1.0,
        3,
    ),
    (
        "logical",
        "  %a : Tensor = aten::lt(%x, %s)\n  %b : Tensor = aten::ge(%x, %half)\n"
        "  %c : Tensor = aten::logical_or(%a, %b)\n  %d : Tensor = aten::logical_not(%c)\n"
        "  %e : Tensor = aten::ne(%x, %x)\n  %f : Tensor = aten::logical_xor(%d, %e)\n"
        "  %y : Tensor = aten::mul(%x, %f)",
        -0.5,
        3,
    ),
    ("mul_self", "  %y : Tensor = aten::mul(%x, %x)", 1.0, 3),
    # The prelude: ops on the 0-dim input alone run with aten, the loop reads their value.
    (
        "prelude",
        "  %a : Tensor = aten::lgamma(%s)\n  %b : Tensor = aten::exp(%a)\n"
        "  %c : Tensor = aten::neg(%s)\n  %p : Tensor = aten::pow(%x, %c)\n"
        "  %y : Tensor = aten::div(%p, %b)",
        1.3,
        3,
    ),
]


def _inputs(scalar, scale, n=4099, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * scale
    x[: len(SPECIALS)] = torch.tensor(SPECIALS)
    if scalar is None:
        s = torch.randn(n, generator=g) * scale
        s[len(SPECIALS) : 2 * len(SPECIALS)] = torch.tensor(SPECIALS)
        s[2 * len(SPECIALS) : 3 * len(SPECIALS)] = 0.0
    else:
        s = torch.tensor(float(scalar))
    return x, s


def _run(ir, x, s, kernel, monkeypatch, grads=True, grad_t=False):
    monkeypatch.setenv("MEMSLIM_REGION_KERNEL", "1" if kernel else "0")
    xs = [x.clone().requires_grad_(grads), s.clone().requires_grad_(grads)]
    outs = torch.ops.memslim.recompute_region(xs, ir)
    if not grads:
        return [o.detach() for o in outs]
    g = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(7))
    if grad_t:  # the same shape, transposed strides
        g = g.t().contiguous().t()
        assert not g.is_contiguous()
    torch.autograd.backward(outs[0], g)
    return [outs[0].detach(), xs[0].grad, xs[1].grad]


def _close(got, want, what, ref=None):
    """got (the loop) against want (aten's fp32): the same NaNs and infinities; where aten
    is finite, an error against `ref` (the fp64 interpreter; else aten) within 4x aten's own
    in the L2 norm plus 1e-6 relative (cancellations make single elements of both paths
    differ by many of the result's ulps), and no element off by more than 1e-3 of its scale."""
    if want is None or got is None:
        assert got is None and want is None, what
        return
    assert got.shape == want.shape and got.dtype == want.dtype, what
    assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{what}: NaNs differ from aten's"
    inf = torch.isinf(want)
    assert torch.equal(got[inf], want[inf]), f"{what}: infinities differ from aten's"
    r = (want if ref is None else ref.reshape(want.shape)).double()
    keep = torch.isfinite(want) & (r.abs() < 1e20)
    g, w, r = got[keep].double(), want[keep].double(), r[keep]
    scale = float(r.norm()) + 1e-300
    e_got, e_aten = float((g - r).norm()) / scale, float((w - r).norm()) / scale
    assert e_got <= 4 * e_aten + 1e-6, f"{what}: L2 error {e_got:.3g}, aten's {e_aten:.3g}"
    rms = scale / max(1, r.numel()) ** 0.5
    err = (g - r).abs()
    bad = err > 1e-3 * (r.abs() + rms) + 1e-30
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} elements off; worst at "
        f"{r[err.argmax()].item()}: got {g[err.argmax()].item()}"
    )


@pytest.mark.parametrize("name,body,scalar,scale", CASES, ids=[c[0] for c in CASES])
def test_fused_loop_matches_aten(name, body, scalar, scale, monkeypatch):
    ir = _ir(body)
    x, s = _inputs(scalar, scale)
    fused = _run(ir, x, s, True, monkeypatch)
    aten = _run(ir, x, s, False, monkeypatch)
    ref = _run(ir, x.double(), s.double(), False, monkeypatch)
    for what, a, b, r in zip(["value", "grad x", "grad s"], fused, aten, ref):
        _close(a, b, f"{name} {what}", r)


def test_fused_loop_runs_and_interpreter_is_its_reference(monkeypatch):
    # Transcendental ops round differently in libmvec and Sleef: a bit-equal result here
    # would mean the loop never ran.
    ir = _ir("  %e : Tensor = aten::exp(%x)\n  %y : Tensor = aten::mul(%e, %s)")
    x, s = _inputs(1.3, 3, n=100000)
    fused = _run(ir, x, s, True, monkeypatch)
    aten = _run(ir, x, s, False, monkeypatch)
    assert not torch.equal(fused[0], aten[0])
    _close(fused[0], aten[0], "value")


@pytest.mark.parametrize("layout", ["broadcast", "float64", "strided", "grad_output_strided"])
def test_inputs_the_loop_does_not_take_run_the_interpreter(layout, monkeypatch):
    ir = _ir("  %e : Tensor = aten::exp(%x)\n  %y : Tensor = aten::mul(%e, %s)")
    x, s = _inputs(None, 2, n=4096)
    if layout == "broadcast":
        x, s = x.reshape(64, 64), s[:64]
    elif layout == "float64":
        x, s = x.double(), s.double()
    elif layout == "strided":
        x, s = x.reshape(64, 64).t(), s.reshape(64, 64).t()
    grad_t = layout == "grad_output_strided"
    if grad_t:  # contiguous inputs, a strided output gradient: the loop both ways
        x, s = x.reshape(64, 64), s.reshape(64, 64)
    fused = _run(ir, x, s, True, monkeypatch, grad_t=grad_t)
    aten = _run(ir, x, s, False, monkeypatch, grad_t=grad_t)
    for a, b in zip(fused, aten):
        if layout == "grad_output_strided":
            _close(a, b, layout)
        else:
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), layout


def test_bool_output_and_unsupported_op_fall_back(monkeypatch):
    # A bool output and an op without a loop form (erfinv) run the interpreter: bit for bit.
    for body, outs in [
        ("  %y : Tensor = aten::exp(%x)\n  %m : Tensor = aten::gt(%x, %s)", "%y, %m"),
        ("  %e : Tensor = aten::erfinv(%x)\n  %y : Tensor = aten::mul(%e, %s)", "%y"),
    ]:
        ir = _ir(body, outs=outs)
        x, s = _inputs(0.5, 0.5)
        fused = _run(ir, x, s, True, monkeypatch)
        aten = _run(ir, x, s, False, monkeypatch)
        for a, b in zip(fused, aten):
            assert (a is None and b is None) or torch.equal(a.nan_to_num(), b.nan_to_num())


def test_two_outputs_and_only_scalar_needs_grad(monkeypatch):
    ir = _ir(
        "  %a : Tensor = aten::mul(%x, %s)\n  %b : Tensor = aten::sigmoid(%a)\n"
        "  %y : Tensor = aten::mul(%b, %x)",
        outs="%y, %a",
    )
    x, s = _inputs(0.8, 2)
    res = []
    for kernel in (True, False):
        monkeypatch.setenv("MEMSLIM_REGION_KERNEL", "1" if kernel else "0")
        sg = s.clone().requires_grad_(True)
        y, a = torch.ops.memslim.recompute_region([x, sg], ir)
        (y.sum() + 2 * a.sum()).backward()
        res.append((y.detach(), a.detach(), sg.grad))
    for a, b in zip(*res):
        _close(a, b, "two outputs")


def test_hand_activation_resnet_trains_like_eager():
    import torchvision

    from memslim._models import TrainableAct, swap_activation

    torch.manual_seed(0)
    ref = swap_activation(torchvision.models.resnet18(num_classes=10), torch.nn.ReLU, TrainableAct)
    ours = memslim.optimize(torch.jit.script(copy.deepcopy(ref)), (torch.randn(4, 3, 32, 32),))
    assert "memslim::recompute_region" in str(ours.graph)
    torch.manual_seed(1)
    xs = [torch.randn(8, 3, 32, 32) for _ in range(3)]
    assert_training_error_like_eager(ref, ours, xs, steps=3)
