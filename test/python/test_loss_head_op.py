"""memslim::linear_cross_entropy against aten's linear + cross_entropy.

What: the loss head without its logits (runtime/loss_head_ops.cpp): loss and
gradients against aten's for every reduction, ignore_index (including a batch
with every target ignored), label smoothing, a bias, a float cast of 16-bit
logits, bf16, odd chunk sizes, NaN / inf logits, out-of-range targets (aten's
error); what it keeps for backward (saved_tensors_hooks: the input, the
targets and one float per row, no logits); torch.library.opcheck with dynamic
shapes; torch.compile of the op itself.
Why: the op replaces a model's loss head, so it must be aten's loss to
rounding, whatever the head's options.
"""

import pytest
import torch
import torch.nn.functional as F

import memslim  # noqa: F401  (loads the op library)

op = torch.ops.memslim.linear_cross_entropy
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _aten(h, w, b, t, reduction, ignore_index, smoothing, logits_dtype):
    z = F.linear(h, w, b)
    if logits_dtype is not None:
        z = z.to(logits_dtype)
    z = z.reshape(-1, z.shape[-1])
    return F.cross_entropy(
        z,
        t.reshape(-1),
        reduction=reduction,
        ignore_index=ignore_index,
        label_smoothing=smoothing,
    )


def _inputs(n=37, d=16, v=50, dtype=torch.float64, bias=False, ignore=0.2, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g, dtype=dtype) * 0.5).requires_grad_()
    b = (torch.randn(v, generator=g, dtype=dtype)).requires_grad_() if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    t[torch.rand(n, generator=g) < ignore] = -100
    return h, w, b, t


def _both(
    h,
    w,
    b,
    t,
    reduction="mean",
    ignore_index=-100,
    smoothing=0.0,
    logits_dtype=None,
    chunk=0,
    gif=True,
):
    leaves = [x for x in (h, w, b) if x is not None]
    ref = _aten(h, w, b, t, reduction, ignore_index, smoothing, logits_dtype)
    got = op(h, w, b, t, REDUCTIONS[reduction], ignore_index, smoothing, logits_dtype, chunk, gif)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    seed = torch.randn(ref.shape, dtype=ref.dtype, generator=torch.Generator().manual_seed(1))
    gr = torch.autograd.grad(ref, leaves, seed)
    gg = torch.autograd.grad(got, leaves, seed)
    return ref, got, gr, gg


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [0, 1, 5, 37, 100])
@pytest.mark.parametrize("gif", [True, False])
def test_matches_aten_fp64(reduction, smoothing, bias, chunk, gif):
    ref, got, gr, gg = _both(*_inputs(bias=bias), reduction, -100, smoothing, None, chunk, gif)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(gg, gr):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("gif", [True, False])
def test_matches_aten_fp32_within_1e5(reduction, gif):
    h, w, b, t = _inputs(n=300, d=64, v=1000, dtype=torch.float32, bias=True)
    ref, got, gr, gg = _both(h, w, b, t, reduction, -100, 0.0, None, 64, gif)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, b_ in zip(gg, gr):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-6)


def _as_close_as_aten(h, w, b, t, reduction, smoothing, chunk, gif):
    """The op's fp32 loss and gradients against aten's fp32 and fp64 ones: NaN where
    aten's are, and elsewhere no further from fp64's than twice aten's own distance
    (plus 1e-6 of the largest value): chunking changes the matmuls' rounding."""
    ref, got, gr, gg = _both(h, w, b, t, reduction, -100, smoothing, None, chunk, gif)
    x64 = [x.detach().double().requires_grad_() if x is not None else None for x in (h, w, b)]
    r64 = _aten(*x64, t, reduction, -100, smoothing, None)
    seed = torch.randn(r64.shape, dtype=torch.float32, generator=torch.Generator().manual_seed(1))
    g64 = torch.autograd.grad(r64, [x for x in x64 if x is not None], seed.double())
    for a, b_, c in zip((got, *gg), (ref, *gr), (r64, *g64)):
        assert torch.equal(a.isnan(), b_.isnan())
        assert torch.equal(a.isinf(), b_.isinf())
        ok = b_.isfinite() & c.isfinite()
        c = c.detach()
        scale = float(c[ok].abs().max()) if ok.any() else 0.0
        e_op = float((a[ok].double() - c[ok]).abs().max()) if ok.any() else 0.0
        e_aten = float((b_[ok].double() - c[ok]).abs().max()) if ok.any() else 0.0
        assert e_op <= 2 * e_aten + 1e-6 * scale, (e_op, e_aten, scale)


@pytest.mark.parametrize("v", [7, 16, 529, 1000])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("gif", [True, False])
def test_fp32_rows_kernel_as_close_as_aten(v, smoothing, gif):
    """fp32 heads run kernels/' softmax_rows (rows shorter than a vector, a whole
    vector, blocks of 512 with a tail): as close to fp64 as aten's fp32."""
    h, w, b, t = _inputs(n=70, d=24, v=v, dtype=torch.float32, bias=True, seed=v)
    for reduction in ("mean", "none"):
        _as_close_as_aten(h, w, b, t, reduction, smoothing, 32, gif)


def test_fp32_rows_kernel_large_logits_and_nan_inf():
    """Logits beyond +-88 (exp overflows fp32 without the max), a NaN logit, a +inf
    logit, an ignored row with a NaN softmax: the fp32 path gives aten's NaNs and
    values as close to fp64 as aten's (where fp64's are finite)."""
    h, w, b, t = _inputs(n=12, d=16, v=600, dtype=torch.float32, ignore=0.0)
    with torch.no_grad():
        w.mul_(40.0)
        h[2, 0] = float("nan")
        h[5, :] = 0.0
        w[3, 0] = float("inf")
    t[1] = -100
    for reduction, gif in (("none", True), ("sum", True), ("sum", False), ("mean", True)):
        _as_close_as_aten(h, w, b, t, reduction, 0.1, 5, gif)


def test_ignore_index_other_than_default_and_all_ignored():
    h, w, b, t = _inputs(ignore=0.0)
    t[::3] = 7  # a valid class index used as ignore_index
    ref, got, gr, gg = _both(h, w, b, t, "mean", 7, 0.1, None, 4)
    torch.testing.assert_close(got, ref)
    for a, b_ in zip(gg, gr):
        torch.testing.assert_close(a, b_)
    t_all = torch.full_like(t, -100)
    ref, got, gr, gg = _both(h, w, b, t_all, "mean")
    assert torch.isnan(ref) and torch.isnan(got)  # 0 / 0, as aten


def test_bf16_logits_cast_to_float_as_transformers_does():
    h, w, b, t = _inputs(n=64, d=32, v=300, dtype=torch.bfloat16)
    ref, got, gr, gg = _both(h, w, b, t, "mean", -100, 0.0, torch.float32, 16)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, b_ in zip(gg, gr):  # chunked accumulation rounds as bf16 does
        torch.testing.assert_close(a.float(), b_.float(), rtol=2e-2, atol=2e-3)


def test_bf16_logits_in_bf16():
    h, w, b, t = _inputs(n=64, d=32, v=300, dtype=torch.bfloat16)
    ref, got, gr, gg = _both(h, w, b, t, "sum", -100, 0.0, None, 16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=1e-1)
    for a, b_ in zip(gg, gr):
        torch.testing.assert_close(a.float(), b_.float(), rtol=2e-2, atol=5e-3)


def test_nan_and_inf_logits_as_aten():
    h, w, b, t = _inputs(n=8, ignore=0.0)
    with torch.no_grad():
        h[2, 0] = float("nan")
        h[5, :] = 0.0
        w[3, 0] = float("inf")
    t[1] = -100  # an ignored row with a NaN softmax: NaN gradients in aten too
    for reduction, gif in (("none", True), ("sum", True), ("sum", False)):
        ref, got, gr, gg = _both(h, w, b, t, reduction, gif=gif)
        torch.testing.assert_close(got, ref, equal_nan=True)
        for a, b_ in zip(gg, gr):
            torch.testing.assert_close(a, b_, equal_nan=True)


def test_out_of_range_target_is_aten_error():
    h, w, b, t = _inputs(ignore=0.0)
    t[3] = 50
    with pytest.raises(IndexError, match="Target 50 is out of bounds"):
        op(h, w, b, t)
    with pytest.raises(RuntimeError, match="class indices"):
        op(h, w, b, t.double())


def test_backward_of_one_hands_over_and_retain_graph_repeats():
    h, w, b, t = _inputs(bias=True)
    ref = _aten(h, w, b, t, "mean", -100, 0.0, None)
    ref.backward()
    want = [x.grad.clone() for x in (h, w, b)]
    for x in (h, w, b):
        x.grad = None
    loss = op(h, w, b, t)
    loss.backward(retain_graph=True)
    first = [x.grad.clone() for x in (h, w, b)]
    loss.backward()  # the saved gradients were not changed by the first
    for a, b_, c in zip(first, want, (h, w, b)):
        torch.testing.assert_close(a, b_)
        torch.testing.assert_close(c.grad, 2 * b_)


@pytest.mark.parametrize("gif", [True, False])
def test_keeps_no_logits(gif):
    h, w, b, t = _inputs(n=256, d=32, v=4000, dtype=torch.float32, ignore=0.0)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = torch.nn.Linear(32, 4000, bias=False)

        def forward(self, x):
            x = x * 1.0  # an activation, counted
            return op(x, self.lm.weight, None, t, 1, -100, 0.0, None, 0, gif)

    kept = memslim.saved_bytes(Head(), h.detach().requires_grad_())
    logits = 256 * 4000 * 4
    if gif:  # the input's and the weight's gradients
        assert kept == 256 * 32 * 4 + 4000 * 32 * 4, kept
    else:  # x, targets, lse
        assert kept <= 256 * 32 * 4 + 256 * 8 + 256 * 4 + 64, kept
        assert kept < logits / 50


def test_opcheck_dynamic():
    for n, chunk in ((37, 0), (12, 5)):
        h, w, b, t = _inputs(n=n, bias=True, dtype=torch.float32)
        for gif in (True, False):
            torch.library.opcheck(op, (h, w, b, t, 1, -100, 0.1, None, chunk, gif))
        torch.library.opcheck(op, (h, w, None, t, 0, -100, 0.0, torch.float64, chunk))


@pytest.mark.parametrize("gif", [True, False])
def test_compiled_op_matches_eager(gif):
    h, w, b, t = _inputs(n=40, dtype=torch.float32, bias=True)

    def f(h, w, b, t):
        return op(h, w, b, t, 1, -100, 0.0, None, 8, gif) * 2.0

    ref = f(h, w, b, t)
    gr = torch.autograd.grad(ref, (h, w, b))
    cf = torch.compile(f, backend="aot_eager", dynamic=True)
    got = cf(h, w, b, t)
    gg = torch.autograd.grad(got, (h, w, b))
    torch.testing.assert_close(got, ref)
    for a, b_ in zip(gg, gr):
        torch.testing.assert_close(a, b_)


def test_double_backward_refused():
    h, w, b, t = _inputs(ignore=0.0)
    loss = op(h, w, b, t)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, h, create_graph=True)


def test_autocast_as_aten_linear_then_float32_loss():
    """Under torch.autocast the op runs the head in bf16 and the loss in float32, as
    autocast runs aten's linear and cross_entropy (graphs traced above autocast carry
    the op with the model's float32 arguments)."""
    h, w, b, t = _inputs(n=64, d=32, v=300, dtype=torch.float32, bias=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(h, w, b), t)
        got = op(h, w, b, t)
    assert got.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)  # the same bf16 logits
    gr, gg = torch.autograd.grad(ref, (h, w, b)), torch.autograd.grad(got, (h, w, b))
    for a, b_ in zip(gg, gr):
        assert a.dtype == b_.dtype == torch.float32
        torch.testing.assert_close(a, b_, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("gif", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_no_rows_as_aten(reduction, gif, dtype):
    """No tokens: no chunk runs, so the weight's gradient (written by the first chunk
    otherwise) must still come back as aten's zeros; the loss as aten's (NaN for mean)."""
    h, w, b, t = _inputs(n=0, d=16, v=50, dtype=dtype, bias=True)
    ref, got, gr, gg = _both(h, w, b, t, reduction, -100, 0.0, None, 0, gif)
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    for a, b_ in zip(gg, gr):
        torch.testing.assert_close(a, b_, rtol=0, atol=0, equal_nan=True)


def test_uneven_chunks_and_vocab_tiles_fp32():
    """1,000 rows at most 144 a chunk (equal chunks of 143) and a vocabulary of 4,500
    (three matmul tiles of 2,000, the last 500): fp32 values and gradients as aten's."""
    h, w, b, t = _inputs(n=1000, d=32, v=4500, dtype=torch.float32, bias=True, seed=3)
    ref, got, gr, gg = _both(h, w, b, t, "mean", -100, 0.0, None, 144, True)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    for a, b_ in zip(gg, gr):
        torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-7)
