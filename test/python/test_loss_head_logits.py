"""The loss head whose logits the graph also returns: memslim::linear_cross_entropy
reading them (`logits=`) and memslim::linear, whose backward skips a zero gradient.

What: the ops against aten's linear + cross_entropy (fp64 to 1e-10, fp32 to 1e-5) for
the loss and every gradient, where the user's loss reads only the head's loss and where
it also reads the logits (their gradient nonzero); memslim::linear's backward on an
undefined, an all-zero and a nonzero gradient, and its double backward; opcheck of both
ops with dynamic shapes; the pass through TorchScript and torch.export on a model that
returns its logits: the same loss and gradients as eager's, with and without a second
reader of the logits (inside the model and in the user's loss), the record naming the
form, nothing logits-sized kept.
Why: a rewrite that changes a gradient trains a wrong model; the logits' gradient path
is the one the loss op no longer carries.
"""

import pytest
import torch
import torch.nn.functional as F

import memslim
import memslim.fx
from test_loss_head_pass import _way

op = torch.ops.memslim.linear_cross_entropy
lin = torch.ops.memslim.linear
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _inputs(n=37, d=16, v=50, dtype=torch.float64, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g, dtype=dtype) * 0.5).requires_grad_()
    b = torch.randn(v, generator=g, dtype=dtype).requires_grad_() if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    t[torch.rand(n, generator=g) < 0.2] = -100
    return h, w, b, t


def _step(h, w, b, t, ours, reduction, smoothing, chunk, gif, second_reader):
    """The loss (plus, with second_reader, a term of the logits) and the leaves'
    gradients, through aten's head or through memslim::linear + the op reading it."""
    leaves = [x for x in (h, w, b) if x is not None]
    if ours:
        z = lin(h, w, b)
        loss = op(h, w, b, t, REDUCTIONS[reduction], -100, smoothing, None, chunk, gif, logits=z)
    else:
        z = F.linear(h, w, b)
        loss = F.cross_entropy(
            z, t, reduction=reduction, ignore_index=-100, label_smoothing=smoothing
        )
    total = loss.sum() * 1.5
    if second_reader:  # the logits' gradient is nonzero
        total = total + (z.square() * 0.01).mean() + z[:, 3].sum()
    return loss, torch.autograd.grad(total, leaves)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [0, 5])
@pytest.mark.parametrize("gif", [True, False])
@pytest.mark.parametrize("second_reader", [False, True])
def test_reading_the_logits_matches_aten_fp64(reduction, smoothing, chunk, gif, second_reader):
    h, w, b, t = _inputs()
    args = (h, w, b, t)
    ref, gr = _step(*args, False, reduction, smoothing, chunk, gif, second_reader)
    got, gg = _step(*args, True, reduction, smoothing, chunk, gif, second_reader)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    for a, b_ in zip(gg, gr):
        torch.testing.assert_close(a, b_, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("second_reader", [False, True])
def test_reading_the_logits_fp32_within_1e5(reduction, second_reader):
    h, w, b, t = _inputs(n=300, d=64, v=1000, dtype=torch.float32)
    ref, gr = _step(h, w, b, t, False, reduction, 0.0, 0, True, second_reader)
    got, gg = _step(h, w, b, t, True, reduction, 0.0, 0, True, second_reader)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, b_ in zip(gg, gr):
        assert float((a - b_).norm() / b_.norm()) < 1e-5


def test_logits_not_the_linears_is_an_error():
    h, w, b, t = _inputs()
    with pytest.raises(RuntimeError, match="logits must be linear"):
        op(h, w, b, t, logits=torch.zeros(37, 49, dtype=torch.float64))


def test_linear_backward_undefined_zero_and_nonzero():
    h, w, b, _ = _inputs(n=8, d=4, v=6)
    z = lin(h, w, b)
    torch.testing.assert_close(z, F.linear(h, w, b), rtol=0, atol=0)
    # nothing reads the output: no gradient reaches the leaves through it
    other = (h * 2).sum()
    assert torch.autograd.grad(other + 0 * z.detach().sum(), (w,), allow_unused=True) == (None,)
    zero = torch.autograd.grad(z, (h, w, b), torch.zeros_like(z))
    assert all(bool((g == 0).all()) for g in zero)
    seed = torch.randn_like(z)
    want = torch.autograd.grad(F.linear(h, w, b), (h, w, b), seed)
    got = torch.autograd.grad(lin(h, w, b), (h, w, b), seed)
    for a, b_ in zip(got, want):
        torch.testing.assert_close(a, b_, rtol=1e-12, atol=1e-12)
    # a NaN anywhere is not zero: it reaches the gradients as aten's does
    seed = torch.zeros_like(z)
    seed[3, 2] = float("nan")
    assert bool(torch.autograd.grad(lin(h, w, b), h, seed)[0].isnan().any())


def test_linear_double_backward():
    h, w, b, _ = _inputs(n=5, d=3, v=4)
    assert torch.autograd.gradcheck(lin, (h, w, b))
    assert torch.autograd.gradgradcheck(lin, (h, w, b))


def test_opcheck_dynamic():
    for n, chunk in ((37, 0), (12, 5)):
        h, w, b, t = _inputs(n=n, dtype=torch.float32)
        torch.library.opcheck(lin, (h, w, b))
        torch.library.opcheck(lin, (h.reshape(1, n, -1), w, None))
        z = lin(h, w, b).detach().requires_grad_()
        for gif in (True, False):
            torch.library.opcheck(op, (h, w, b, t, 1, -100, 0.1, None, chunk, gif, z))
        torch.library.opcheck(op, (h, w, b, t, 0, -100, 0.0, torch.float64, chunk, True, z))


# ---- the pass ----------------------------------------------------------------

VOCAB, D = 3000, 32


class Head(torch.nn.Module):
    """transformers' loss (float cast, flattened tokens, ignore_index -100); returns
    the loss and the logits; z_loss: a second reader of the logits inside the model."""

    z_loss: torch.jit.Final[bool]

    def __init__(self, z_loss=False):
        super().__init__()
        self.body = torch.nn.Linear(D, D)
        self.lm = torch.nn.Linear(D, VOCAB)
        self.z_loss = z_loss

    def forward(self, x, t):
        logits = self.lm(torch.tanh(self.body(x)))
        loss = F.cross_entropy(
            logits.float().view(-1, logits.size(-1)), t.view(-1), ignore_index=-100
        )
        if self.z_loss:
            loss = loss + 1e-3 * logits.logsumexp(-1).square().mean()
        return loss, logits


def _pass_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, D, generator=g)
    t = torch.randint(0, VOCAB, (2, 64), generator=g)
    t[0, :7] = -100
    return x, t


def _grads(mod, x, t, user_reads_logits):
    for p in mod.parameters():
        p.grad = None
    loss, logits = mod(x, t)
    total = loss + (logits.square().mean() * 0.1 if user_reads_logits else 0)
    total.backward()
    return loss, logits, {k: p.grad.clone() for k, p in mod.named_parameters()}


@pytest.mark.parametrize("way", ["torchscript", "export"])
@pytest.mark.parametrize("z_loss", [False, True])
@pytest.mark.parametrize("user_reads_logits", [False, True])
def test_pass_reads_the_returned_logits(way, z_loss, user_reads_logits):
    x, t = _pass_inputs()
    torch.manual_seed(0)
    model = Head(z_loss)
    want_loss, want_logits, want = _grads(model, x, t, user_reads_logits)
    handle, mod = _way(model, way, x, t)
    got_loss, got_logits, got = _grads(mod, x, t, user_reads_logits)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
    for k in want:
        assert float((got[k] - want[k]).norm() / want[k].norm()) < 1e-5, k
    records = [str(d) for d in memslim.report(handle) if "fuse-loss-head" in str(d)]
    assert len(records) == 1 and "form: reads the logits it returns" in records[0], records


@pytest.mark.parametrize("way", ["torchscript", "export"])
def test_pass_keeps_nothing_logits_sized(way):
    x, t = _pass_inputs()
    torch.manual_seed(0)
    model = Head()
    eager = memslim.saved_bytes(lambda a, b: model(a, b)[0], x, t)
    _, mod = _way(model, way, x, t)
    ours = memslim.saved_bytes(lambda a, b: mod(a, b)[0], x, t)
    logits = 2 * 64 * VOCAB * 4
    # eager keeps log_softmax's output; ours the head's input and its gradient,
    # and the weight's and bias's gradients (computed in forward)
    assert eager >= logits
    assert ours <= eager - logits + (2 * 128 * D + VOCAB * (D + 1)) * 4, (eager, ours)
