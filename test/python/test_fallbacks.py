"""Frames Dynamo gives up on, for objects compiled with memslim's backend (fallbacks.py;
label `slow`: each test compiles): Dynamo's recompile limit (memslim.compile's backends
are partials, one cache entry each; a recompile on shapes under backend="memslim"), a
graph break in a loop (the frame skipped): each listed in memslim.report(x).fallbacks()
and memslim.summary(x) with its cause, or a FallbackError under strict mode; an object
whose calls run eager because the limit was hit for another object is listed at report
time; objects of other backends are left alone, and torch's log output is unchanged."""

import logging

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import memslim
from memslim import fallbacks


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 16)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


class Loop(nn.Module):
    """A graph break inside a loop: Dynamo skips the whole frame (torch 2.14.1)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 16)

    def forward(self, x):
        for _ in range(2):
            x = self.b(F.gelu(self.a(x)))
            torch._dynamo.graph_break()
        return x


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _step(model, rows=8):
    model(torch.randn(rows, 16)).sum().backward()


def test_the_recompile_limit_is_counted_with_its_cause(monkeypatch):
    monkeypatch.delenv("MEMSLIM_STRICT", raising=False)
    with torch._dynamo.config.patch(recompile_limit=1):
        first, second, third = (memslim.compile(Mlp()) for _ in range(3))
        _step(first)  # the code's one cache entry
        _step(second)  # another backend (a partial): a recompile, over the limit
        _step(third)  # the code runs cached graphs only now: eager, no event at all
    assert memslim.report(first).fallbacks() == []
    [d] = memslim.report(second).fallbacks()
    assert d.pass_ == "dynamo-fallback" and d.verdict == "note"
    assert "Dynamo gave up on forward at test_fallbacks.py" in d.text
    assert "Dynamo's recompile_limit (1)" in d.text and "it runs eager" in d.text
    text = memslim.summary(second)
    assert "fallbacks: 1" in text and "dynamo-fallback: Dynamo gave up on forward" in text
    [d3] = memslim.report(third).fallbacks()
    assert "for another object" in d3.text and "this object's calls of it run eager" in d3.text


def test_the_recompile_limit_raises_under_strict():
    with torch._dynamo.config.patch(recompile_limit=1):
        first, second = memslim.compile(Mlp(), strict=True), memslim.compile(Mlp(), strict=True)
        _step(first)
        with pytest.raises(fallbacks.FallbackError, match=r"recompile_limit \(1\)"):
            _step(second)


def test_a_recompile_on_shapes_under_the_backend_is_counted(monkeypatch):
    monkeypatch.delenv("MEMSLIM_STRICT", raising=False)
    compiled = torch.compile(Mlp(), backend="memslim")
    with torch._dynamo.config.patch(recompile_limit=1, automatic_dynamic_shapes=False):
        _step(compiled, rows=8)
        _step(compiled, rows=4)  # a new shape: a recompile, over the limit
    rep = memslim.report(compiled)
    [d] = rep.fallbacks()
    assert "recompile_limit (1)" in d.text and "size mismatch" in d.text
    assert sum(n.startswith("graph ") for n, _ in rep.graphs) == 1  # the compiled one


def test_a_graph_break_in_a_loop_is_counted(monkeypatch):
    monkeypatch.delenv("MEMSLIM_STRICT", raising=False)
    compiled = torch.compile(Loop(), backend="memslim")
    _step(compiled)
    [d] = memslim.report(compiled).fallbacks()
    assert d.text.startswith("Dynamo gave up on forward at test_fallbacks.py")
    assert "Unsupported: graph break in loop (at test_fallbacks.py:" in d.text


def test_a_graph_break_in_a_loop_raises_under_strict(monkeypatch):
    monkeypatch.setenv("MEMSLIM_STRICT", "1")
    compiled = torch.compile(Loop(), backend="memslim")
    with pytest.raises(fallbacks.FallbackError, match="graph break in loop"):
        _step(compiled)


def test_other_backends_are_left_alone(monkeypatch):
    monkeypatch.setenv("MEMSLIM_STRICT", "1")
    compiled = torch.compile(Loop(), backend="eager")
    _step(compiled)  # Dynamo skips the frame as it always did; no error of memslim's
    with pytest.raises(ValueError, match="memslim never saw"):
        memslim.report(compiled)


def test_torchs_log_output_is_unchanged():
    logger = logging.getLogger("torch._dynamo.convert_frame")
    [watch] = [f for f in logger.filters if isinstance(f, fallbacks._Watch)]
    shown = logger.parent.getEffectiveLevel()
    info = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "x", (), None)
    warning = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "x", (), None)
    assert watch.filter(info) is (logging.INFO >= shown)
    assert watch.filter(warning) is (logging.WARNING >= shown)
    assert logger.isEnabledFor(logging.INFO)  # the suppressed frame's record is made
