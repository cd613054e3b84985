"""torch.compile(backend="memslim"): gradients as Inductor's, fewer bytes kept, the
partition that keeps less chosen per graph, budgets, dropout and graphs without gradients.
Split from test_fx.py (its models and helpers live there) to keep each file readable."""

import math

import pytest
import torch
import torch.nn as nn
from test_fx import MLP, _close, _grads

import memslim
from memslim.measure import saved_bytes


def _compile_pair(model, **kw):
    torch._dynamo.reset()
    return torch.compile(model, **kw), memslim.compile(model, **kw)


def test_compile_backend_rewrites_hand_written_gelu():
    # GPT-2's gelu_new: Inductor recomputes the formula from the linear's output and
    # keeps that; memslim's GELU keeps its output (which the next linear keeps anyway).

    class G(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 64)
            self.b = nn.Linear(64, 16)

        def forward(self, x):
            h = self.a(x)
            return self.b(
                0.5
                * h
                * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
            )

    model = G().train()
    x = torch.randn(32, 16)
    plain, ours = _compile_pair(model)
    _close(_grads(ours, x), _grads(model, x), 1e-5)
    assert saved_bytes(ours, x) < saved_bytes(plain, x)
    assert any(
        d.pass_ == "canonicalize-activations" and d.verdict == "rewrote"
        for d in memslim.report(ours)
    )


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_backend_keeps_less_than_inductor_with_the_same_gradients(dynamic):
    model = MLP().train()
    x = torch.randn(16, 32)
    plain, ours = _compile_pair(model, dynamic=dynamic)
    want = _grads(model, x)
    _close(_grads(ours, x), want, 1e-5)
    _close(_grads(plain, x), want, 1e-5)
    assert saved_bytes(ours, x) < saved_bytes(plain, x)
    assert any(d.verdict == "rewrote" for d in memslim.report(ours))
    # Another batch size: dynamic shapes (or a recompile) must work.
    x2 = torch.randn(7, 32)
    _close(_grads(ours, x2), _grads(model, x2), 1e-5)


def test_compile_backend_is_registered_by_name():
    model = MLP()
    x = torch.randn(4, 32)
    torch._dynamo.reset()
    n = len(memslim.compiled_decisions())
    out = torch.compile(model, backend="memslim")(x)
    torch.testing.assert_close(out, model(x))
    assert len(memslim.compiled_decisions()) > n


def test_compile_rejects_bad_policy():
    with pytest.raises(ValueError, match="max_added_work"):
        memslim.compile(MLP(), max_added_work=-3)


def test_compile_leaves_a_graph_to_inductor_when_its_partitioner_keeps_less(monkeypatch):
    # The backend partitions both versions and compiles the better.
    # conv -> BN -> GELU -> conv with output-saving alone (the fusions off): Inductor
    # keeps the BN input and recomputes the normalisation and the GELU in backward;
    # the output-saving GELU would keep its output on top -> left to Inductor.
    # With the default passes memslim keeps only the BN output (the GELU goes into
    # the next conv, the BN keeps its output): fewer bytes -> rewrites kept.
    import memslim.backend as B

    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.GELU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.GELU(),
        nn.Conv2d(8, 4, 3, padding=1),
    ).train()
    x = torch.randn(2, 3, 8, 8)
    for passes, left in [(["output-saving-activations"], True), (None, False)]:
        if passes:
            monkeypatch.setattr(B, "_compile_passes", lambda: passes)
        else:
            monkeypatch.undo()
        plain, ours = _compile_pair(model)
        _close(_grads(ours, x), _grads(model, x), 1e-5)
        [note] = [d for d in memslim.report(ours) if d.pass_ == "inductor-partition"]
        if left:
            assert note.bytes_after >= note.bytes_before and "graph left to Inductor" in note
        else:
            assert note.bytes_after < note.bytes_before and "rewrites kept" in note
        assert saved_bytes(ours, x) <= saved_bytes(plain, x)


def test_compile_under_an_activation_memory_budget():
    # With a budget, the partitioner may recompute memslim's forward in the lazily
    # compiled backward (resnet50_gelu at 0.5 failed with DynamicOutputShapeException
    # before the frame's ShapeEnv kept allowing data-dependent sizes).
    from torch._functorch import config as functorch_config

    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.GELU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.GELU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 32),
        nn.GELU(),
        nn.Linear(32, 4),
    ).train()
    x = torch.randn(4, 3, 8, 8)
    with functorch_config.patch(activation_memory_budget=0.5):
        plain, ours = _compile_pair(model)
        want = _grads(model, x)
        _close(_grads(ours, x), want, 1e-5)
        assert saved_bytes(ours, x) <= saved_bytes(plain, x)


def test_compile_with_dropout_partitions_without_error():
    # The partition dry run met Inductor's seed pass (dropout -> inductor_seed), which
    # needs Inductor's fake mode installed: every graph with a dropout fell back to
    # Inductor unchanged with a warning (strict raised TypeError).
    # (The backend leaves activation + dropout pairs to Inductor: MLP's rewrites, then a
    # dropout on the output.)
    model = nn.Sequential(MLP(), nn.Dropout(0.1)).train()
    x = torch.randn(16, 32)
    torch._dynamo.reset()
    ours = memslim.compile(model, strict=True)
    ours(x).sum().backward()
    notes = [d for d in memslim.report(ours) if d.pass_ == "inductor-partition"]
    assert notes and notes[-1].bytes_before is not None
    assert not any(d.pass_ == "fuse-activation-dropout" for d in memslim.report(ours))


def test_compile_leaves_graphs_without_gradients_to_inductor():
    model = MLP()
    x = torch.randn(4, 32)
    torch._dynamo.reset()
    ours = memslim.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), model(x))
    notes = [d for d in memslim.report(ours) if d.pass_ == "inductor-partition"]
    assert notes and "no gradients in this graph" in notes[-1]
