"""The fuse-loss-head pass through memslim.optimize (TorchScript) and torch.export +
memslim.fx.optimize: the loss and every gradient as eager's, the logits no longer kept
(saved_tensors_hooks), the record naming the site, the logits still returned where the
model returns them, and heads the pass must leave alone left alone.

Why: the pass replaces a model's loss; a wrong gradient here trains a wrong model.
"""

import pytest
import torch
import torch.nn.functional as F

import memslim
import memslim.fx

VOCAB, D = 3000, 32


class Head(torch.nn.Module):
    """A decoder-ish body, a bias-free head, transformers' loss (float cast, flattened
    tokens, ignore_index -100)."""

    # Final: TorchScript reads them as constants (the pass needs constant options)
    smoothing: torch.jit.Final[float]
    reduction: torch.jit.Final[str]

    def __init__(self, smoothing=0.0, reduction="mean"):
        super().__init__()
        self.body = torch.nn.Linear(D, D)
        self.lm = torch.nn.Linear(D, VOCAB, bias=False)
        self.smoothing, self.reduction = smoothing, reduction

    def loss(self, logits, t):
        return F.cross_entropy(
            logits.float().view(-1, logits.size(-1)),
            t.view(-1),
            ignore_index=-100,
            label_smoothing=self.smoothing,
            reduction=self.reduction,
        )

    def forward(self, x, t):
        return self.loss(self.lm(torch.tanh(self.body(x))), t)


class HeadReturningLogits(Head):
    def forward(self, x, t):
        logits = self.lm(torch.tanh(self.body(x)))
        return self.loss(logits, t), logits


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, D, generator=g)
    t = torch.randint(0, VOCAB, (2, 64), generator=g)
    t[0, :7] = -100
    return x, t


def _grads(mod, x, t):
    for p in mod.parameters():
        p.grad = None
    out = mod(x, t)
    loss = out[0] if isinstance(out, tuple) else out
    (loss.sum() if loss.dim() else loss).backward()
    return out, {k: p.grad.clone() for k, p in mod.named_parameters()}


def _way(model, way, x, t):
    if way == "torchscript":
        opt = memslim.optimize(model, (x, t))
        return opt, opt
    ep = torch.export.export(model, (x, t))
    memslim.fx.optimize(ep)
    return ep, ep.module()


def _head_records(handle):
    return [str(d) for d in memslim.report(handle) if "fuse-loss-head" in str(d)]


@pytest.mark.parametrize("way", ["torchscript", "export"])
@pytest.mark.parametrize(
    "cls,kw",
    [
        (Head, {}),
        (Head, {"smoothing": 0.1}),
        (Head, {"reduction": "none"}),
        (HeadReturningLogits, {}),
    ],
)
def test_loss_and_gradients_as_eager(way, cls, kw):
    x, t = _inputs()
    torch.manual_seed(0)
    model = cls(**kw)
    want_out, want = _grads(model, x, t)
    handle, mod = _way(model, way, x, t)
    got_out, got = _grads(mod, x, t)
    want_loss = want_out[0] if isinstance(want_out, tuple) else want_out
    got_loss = got_out[0] if isinstance(got_out, tuple) else got_out
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    if isinstance(want_out, tuple):  # the logits are still the model's
        torch.testing.assert_close(got_out[1], want_out[1], rtol=0, atol=0)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)
    records = _head_records(handle)
    assert len(records) == 1 and "rewrote aten::cross_entropy_loss" in records[0], records
    if cls is HeadReturningLogits:
        assert "form: reads the logits it returns to" in records[0]


@pytest.mark.parametrize("way", ["torchscript", "export"])
def test_logits_no_longer_kept(way):
    x, t = _inputs()
    torch.manual_seed(0)
    model = Head()
    eager = memslim.saved_bytes(model, x, t)
    _, mod = _way(model, way, x, t)
    ours = memslim.saved_bytes(mod, x, t)
    logits = 2 * 64 * VOCAB * 4
    # eager keeps log_softmax's output (the logits' size) and the body's tensors;
    # the op keeps the head's input and weight gradients (128 x 32 + 3000 x 32 floats)
    assert eager >= logits
    assert ours <= eager - logits + (128 * D + VOCAB * D) * 4, (eager, ours)


def test_left_alone():
    class Weighted(Head):
        def forward(self, x, t):
            w = torch.ones(VOCAB)
            return F.cross_entropy(self.lm(x).view(-1, VOCAB), t.view(-1), weight=w)

    class ThreeD(Head):
        def forward(self, x, t):  # classes in dimension 1 of [B, V, T]: not a head layout
            return F.cross_entropy(self.lm(x).transpose(1, 2), t)

    x, t = _inputs()
    for cls, why in ((Weighted, "class weights"), (ThreeD, "its logits")):
        torch.manual_seed(0)
        model = cls()
        ep = torch.export.export(model, (x, t))
        memslim.fx.optimize(ep)
        records = _head_records(ep)
        assert records and all("kept" in r for r in records), records
        assert any(why in r for r in records), records
        torch.testing.assert_close(ep.module()(x, t), model(x, t))
