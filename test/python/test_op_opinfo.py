"""torch.library.opcheck on every memslim op; PyTorch's OpInfo samples through them.

What: (1) torch.library.opcheck (schema, autograd registration, fake tensors,
AOT dispatch with static and dynamic shapes) on each public op, on
activation_forward / activation_backward, activation_dropout and
recompute_region; (2) for each op_db entry whose aten op memslim replaces, its
sample_inputs and reference_inputs (0-d, empty, non-contiguous tensors;
extremal values: NaN, +-inf, huge, tiny) in fp32 / fp64 / bf16 / fp16, the
memslim op's values and input gradients against aten's, with the rules of
test_op_edge_values (NaN where aten has NaN, the same infinities, finite values
within the numerics bars).
Why: the ops claim aten's signatures and numbers; PyTorch's own generators
reach shapes and values nobody on the project picked.
Runtime: reference inputs hold ~3M elements per dtype; a sample over 8k
elements is cut to its non-finite and huge elements plus a strided 8k subset.
aten's gradient is taken on the sample as is, except at NaN inputs, where
aten's vectorised loop is the reference (see test_op_edge_values).
"""

import pytest
import torch

import memslim  # noqa: F401  (registers torch.ops.memslim)
from test_op_edge_values import aten_scalar_path, aten_vector_path, assert_like_aten, grads
from torch.testing._internal.common_methods_invocations import op_db

M = torch.ops.memslim
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _functional(op):
    def f(x, *args, inplace=False, **kwargs):
        assert not inplace, "memslim ops are out of place"
        return op(x, *args, **kwargs)

    return f


# op_db name -> the memslim op, called as the aten op is (input, *args, **kwargs).
MEMSLIM_FOR = {
    "nn.functional.gelu": _functional(lambda x, approximate="none": M.gelu(x, approximate)),
    "nn.functional.silu": _functional(M.silu),
    "nn.functional.mish": _functional(M.mish),
    "nn.functional.softplus": _functional(
        lambda x, beta=1.0, threshold=20.0: M.softplus(x, beta, threshold)
    ),
    "nn.functional.elu": _functional(lambda x, alpha=1.0: M.elu(x, alpha)),
    "nn.functional.celu": _functional(lambda x, alpha=1.0: M.celu(x, alpha)),
    "nn.functional.selu": _functional(M.selu),
    "nn.functional.leaky_relu": _functional(
        lambda x, negative_slope=0.01: M.leaky_relu(x, negative_slope)
    ),
    "nn.functional.hardswish": _functional(M.hardswish),
    "nn.functional.hardsigmoid": _functional(M.hardsigmoid),
    "sigmoid": _functional(M.sigmoid),
    "tanh": _functional(M.tanh),
    "nn.functional.relu": _functional(M.relu),
}
OPINFOS = {o.name: o for o in op_db if o.name in MEMSLIM_FOR and o.variant_test_name == ""}


def test_every_public_op_has_an_opinfo():
    assert set(OPINFOS) == set(MEMSLIM_FOR)
    covered = {n.split(".")[-1] for n in MEMSLIM_FOR}
    assert set(memslim.OPS) == covered


def _reduce(x, limit=8_000):
    """A large sample: its non-finite elements and a strided subset, 1-D."""
    if x.numel() <= limit:
        return x
    flat = x.detach().reshape(-1)
    keep = (~torch.isfinite(flat)) | (flat.abs() > 1e30)
    keep[:: max(1, flat.numel() // limit)] = True
    return flat[keep]


def _forward_reference(aten, x, y_vec):
    # aten's forward, vectorised loop except at non-finite / huge inputs, where
    # the scalar loop is the reference (the vectorised gelu returns NaN at +inf;
    # see test_op_edge_values); one scalar call per distinct such value.
    flat = x.detach().reshape(-1)
    ref = y_vec.clone()
    special = (~torch.isfinite(flat)) | (flat.double().abs() > 1e30)
    if special.any():
        vals = flat[special]
        uniq, inv = torch.unique(vals, return_inverse=True)
        nan_mask = vals.isnan()
        with torch.no_grad():
            per = aten_scalar_path(aten, uniq)
            nan_val = aten_scalar_path(aten, vals[nan_mask][:1]) if nan_mask.any() else None
        fixed = per[inv]
        if nan_val is not None:
            fixed[nan_mask] = nan_val[0]
        ref[special] = fixed
    return ref


def _aten_grad(aten, x):
    y, g = grads(aten, x)
    nan = x.isnan()
    if nan.any():
        _, g_nan = aten_vector_path(aten, x[nan][:1])
        g[nan] = g_nan[0]
    return y, g


def _samples(opinfo, dtype):
    yield from opinfo.sample_inputs("cpu", dtype, requires_grad=False)
    if opinfo.reference_inputs_func is not None:
        yield from opinfo.reference_inputs("cpu", dtype, requires_grad=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(MEMSLIM_FOR))
def test_opinfo_samples_match_aten(name, dtype):
    opinfo = OPINFOS[name]
    ours = MEMSLIM_FOR[name]
    n = 0
    for s in _samples(opinfo, dtype):
        x = _reduce(s.input)
        args, kwargs = s.args, dict(s.kwargs)

        def aten(t):
            return opinfo.op(t, *args, **kwargs)

        def mine(t):
            return ours(t, *args, **kwargs)

        y1, g1 = grads(mine, x)
        y_vec, g2 = _aten_grad(aten, x.detach().reshape(-1))
        y2 = _forward_reference(aten, x, y_vec)
        what = f"{name} {dtype} sample {n} ({tuple(s.input.shape)}, {args}, {kwargs})"
        assert y1.shape == x.shape and g1.shape == x.shape, what
        assert_like_aten(y1.reshape(-1), y2, dtype, what + " forward")
        assert_like_aten(g1.reshape(-1), g2, dtype, what + " grad")
        n += 1
    assert n > 0


# ---------------------------------------------------------------------------
# torch.library.opcheck
# ---------------------------------------------------------------------------
PUBLIC_CALLS = {
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


def _x(shape=(3, 5), dtype=torch.float32, grad=True):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 - 0.5).to(dtype)
    # Values inside the guard band (exact list non-empty) and on a branch edge.
    x.view(-1)[0] = -0.7517915
    x.view(-1)[1] = 0.0
    return x.requires_grad_(grad)


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "nograd"])
@pytest.mark.parametrize("name", sorted(PUBLIC_CALLS))
def test_opcheck_public_ops(name, grad):
    args, kwargs = PUBLIC_CALLS[name]
    op = getattr(M, name.split("_tanh")[0])
    torch.library.opcheck(op, (_x(grad=grad),) + args, kwargs)


@pytest.mark.parametrize(
    "act,params",
    [("gelu", []), ("mish", []), ("elu", [1e5, 1.0, 1.0]), ("softplus", [2.0, 1.0]), ("relu", [])],
)
def test_opcheck_activation_forward_backward(act, params):
    x = _x(dtype=torch.float16 if act == "elu" else torch.float32, grad=False)
    if act == "elu":
        x = x * 1000  # outputs overflow fp16: a non-empty exact list
    for save in (True, False):
        torch.library.opcheck(M.activation_forward, (x, act, params, save))
    y, bits, idx, val = M.activation_forward(x, act, params, True)
    g = torch.randn_like(x)
    out = None if act == "relu" else y
    torch.library.opcheck(M.activation_backward, (g, out, bits, idx, val, act, params))


@pytest.mark.parametrize("act,params", [("gelu_tanh", []), ("silu", []), ("elu", [1.0, 1.0, 1.0])])
def test_opcheck_activation_dropout(act, params):
    x = _x()
    # Deterministic: eval mode, and p = 0 (all of opcheck's tests).
    torch.library.opcheck(M.activation_dropout, (x, act, params, 0.1, False))
    torch.library.opcheck(M.activation_dropout, (x, act, params, 0.0, True))
    # Training with dropout draws random numbers, which the AOT tests would
    # compare across two runs: schema, autograd registration and fake tensors.
    torch.library.opcheck(
        M.activation_dropout,
        (x, act, params, 0.3, True),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


@pytest.mark.parametrize("act,params", [("gelu", []), ("elu", [1.0, 1.0, 1.0])])
def test_activation_dropout_training_under_dynamic_shapes(act, params):
    # Training dropout under torch.compile(dynamic=True): the autograd path
    # traces with symbolic sizes (it called numel() on them); values and
    # gradients as in eager with the same seed (aot_eager keeps eager's RNG).
    def f(x):
        return M.activation_dropout(x, act, params, 0.3, True)

    cf = torch.compile(f, dynamic=True, backend="aot_eager")
    for n in (8, 13, 21):
        x = torch.randn(n, 3, dtype=torch.float64)
        g = torch.randn(n, 3, dtype=torch.float64)
        torch.manual_seed(n)
        y1, g1 = grads(cf, x, g)
        torch.manual_seed(n)
        y2, g2 = grads(f, x, g)
        torch.testing.assert_close(y1, y2, rtol=0, atol=0)
        torch.testing.assert_close(g1, g2, rtol=0, atol=0)


REGION = """graph(%a : Tensor, %b : Tensor):
  %c : int = prim::Constant[value=1]()
  %s : Tensor = aten::sigmoid(%a)
  %m : Tensor = aten::mul(%s, %b)
  %o : Tensor = aten::add(%m, %a, %c)
  return (%o, %s)
"""


def test_opcheck_recompute_region():
    a, b = _x(), _x().detach().mul(0.5).requires_grad_()
    torch.library.opcheck(M.recompute_region, ([a, b], REGION))
