"""memslim.compile(peak_memory=...): the training step's peak as the model's target.

What these tests hold the planner to (budget/model.py StepPeak, budget/measure.py's
Partition): sizes parsed as a user writes them and bad ones refused in one line; on a
residual MLP (one graph) and on a model with a graph break (two graphs), targets between
the smallest reachable peak and the unmodified one are met, the step's peak measured
independently (the profiler's memory events plus the resident tensors) at or under each,
smaller targets never peaking higher; gradients as eager's; the report's "the model"
record gives the predicted and the measured peak, the prediction within 25% of the
measure (issue 48 asks 10%: bench/peak_target.py measures where it stands); a target
below the smallest reachable refused before any backward with that figure, which
on_unreachable="warn" takes; the optimizer's state counted before its first step.
"""

import copy
import gc
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memslim
from memslim.budget import BudgetError
from memslim.budget.model import parse_bytes
from memslim.probe import step_peak_bytes

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class MLP(nn.Module):
    def __init__(self, d=128, h=512, n=3, graph_break=False):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))
            for _ in range(n)
        )
        self.graph_break = graph_break

    def forward(self, x):
        x = x + self.blocks[0](x)
        if self.graph_break:  # not inside a loop: Dynamo would run the whole frame eagerly
            torch._dynamo.graph_break()
        for b in self.blocks[1:]:
            x = x + b(x)
        return F.mse_loss(x, torch.zeros_like(x))


def _model(**kw):
    torch.manual_seed(0)
    return MLP(**kw)


def _x():
    return torch.randn(8, 128, 128, generator=torch.Generator().manual_seed(1))


def _resident(model, x) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()) + [x]:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def _measured_peak(model, fn, x, loss=lambda out: out) -> int:
    """The step's peak as a user would measure it, the loss `loss(fn(x))`: resident + the
    profiler's high-water."""
    for p in model.parameters():
        p.grad = None
    gc.collect()  # nothing of an earlier step freed inside the measured one
    peak = _resident(model, x) + step_peak_bytes(lambda: loss(fn(x)).backward())
    for p in model.parameters():
        p.grad = None
    return peak


def _model_note(compiled) -> str:
    notes = [d.text for d in memslim.report(compiled) if d.text.startswith("the model:")]
    assert notes, [d.text for d in memslim.report(compiled)]
    return notes[-1]


def _figure(text: str, pattern: str) -> int:
    m = re.search(pattern, text)
    assert m, (pattern, text)
    return int(m.group(1).replace(",", ""))


@pytest.mark.parametrize(
    "value, want",
    [
        (123456, 123456),
        (1.5e9, 1_500_000_000),
        ("6GB", 6 * 10**9),
        ("6GiB", 6 * 2**30),
        ("512 MiB", 512 * 2**20),
        ("0.5gb", 500_000_000),
        ("4096", 4096),
        ("4096B", 4096),
        ("100kB", 100_000),
    ],
)
def test_sizes_parse_as_written(value, want):
    assert parse_bytes(value) == want


@pytest.mark.parametrize("value", ["6 bananas", "", "-1GB", "GB", 0, -5, True, [1], float("nan")])
def test_bad_sizes_are_refused_in_one_line(value):
    with pytest.raises(ValueError, match="peak_memory") as e:
        parse_bytes(value)
    assert "\n" not in str(e.value)


def test_keywords_are_checked():
    with pytest.raises(ValueError, match="not both"):
        memslim.compile(_model(), memory_budget=0.5, peak_memory="1GB")
    with pytest.raises(ValueError, match="optimizer= is read only with peak_memory"):
        memslim.compile(_model(), optimizer=torch.optim.SGD(_model().parameters(), lr=0.1))
    with pytest.raises(ValueError, match="is not a size"):
        memslim.compile(_model(), peak_memory="lots")
    with pytest.raises(ValueError, match="memslim.fx.optimize: peak_memory needs a training step"):
        memslim.fx.optimize(None, peak_memory="1GB")


def _unmodified_peak(model, x) -> int:
    torch._dynamo.reset()
    plain = torch.compile(copy.deepcopy(model))
    plain(x).backward()
    return _measured_peak(model, plain, x)


def _floor_peak(model, x) -> int:
    """The smallest peak the planner reaches: a target below it, on_unreachable="warn"."""
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    warned = memslim.compile(m, peak_memory=_resident(model, x) + 1000, on_unreachable="warn")
    with pytest.warns(UserWarning, match="best plan taken"):
        warned(x).backward()
    return _measured_peak(m, warned, x)


@pytest.mark.parametrize("graph_break", [False, True], ids=["one_graph", "graph_break"])
def test_peak_targets_are_met_and_monotone(graph_break):
    x = _x()
    model = _model(graph_break=graph_break)
    eager = copy.deepcopy(model)
    eager(x).backward()
    ref = [p.grad for p in eager.parameters()]

    top = _unmodified_peak(model, x)
    floor = _floor_peak(model, x)
    assert floor < 0.95 * top, (floor, top)
    measured, predicted = [], []
    # Three targets between the smallest reachable peak and the unmodified one.
    for frac in (0.8, 0.5, 0.15):
        limit = int(floor + frac * (top - floor))
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        ours = memslim.compile(m, peak_memory=limit, strict=True)
        ours(x).backward()
        got = [p.grad for p in m.parameters()]
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        note = _model_note(ours)
        assert ": met" in note, note
        peak = _measured_peak(m, ours, x)
        assert peak <= limit, (frac, peak, limit, note)
        said = _figure(note, r"measured ([\d,]+) B in a verifying")
        assert abs(said - peak) <= 0.02 * peak, (said, peak, frac, note)
        pred = _figure(note, r"predicted step peak ([\d,]+) B")
        measured.append(peak)
        predicted.append(pred)
    assert measured == sorted(measured, reverse=True), measured
    for p, m in zip(predicted, measured):
        assert abs(p - m) <= 0.25 * m, (predicted, measured)


def test_a_peak_below_the_floor_is_refused_before_the_backward_and_warn_takes_the_floor():
    x = _x()
    model = _model()
    limit = _resident(model, x) + 1000  # no plan keeps a step within its own parameters
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    ours = memslim.compile(m, peak_memory=limit, strict=True)
    with pytest.raises(BudgetError, match=r"peak_memory [\d,]+ B for the training step") as e:
        ours(x)
    assert "\n" not in str(e.value)
    assert all(p.grad is None for p in m.parameters())
    smallest = e.value.reachable
    assert smallest > limit

    torch._dynamo.reset()
    m = copy.deepcopy(model)
    warned = memslim.compile(m, peak_memory=limit, on_unreachable="warn")
    with pytest.warns(UserWarning, match="best plan taken"):
        warned(x).backward()
    peak = _measured_peak(m, warned, x)
    assert abs(peak - smallest) <= 0.02 * smallest, (peak, smallest)


def test_the_optimizers_state_is_counted_before_its_first_step():
    x = _x()
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch._dynamo.reset()
    ours = memslim.compile(model, peak_memory="1GB", optimizer=opt, strict=True)
    ours(x).backward()
    opt.step()
    note = _model_note(ours)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert _figure(note, r"optimizer state ([\d,]+) B") == 2 * params, note


class _Wide(nn.Module):
    """Its parameters are most of the step, whose peak is at the end of the backward (all
    gradients made, the activations gone), and it returns hidden states, not a loss: the
    shape of the suite's llama_small."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))

    def forward(self, x):
        return x + self.f(x)


def test_a_target_at_the_unmodified_peak_is_met_where_the_output_is_not_a_loss():
    # The suite's llama_small (2026-11-30): every target fell on the unmodified peak and was
    # refused, the verifying step measuring 1 MiB over the user's step: it held the output
    # and its gradient of ones through the whole backward, where a user's loss frees both
    # at the backward's start.
    torch.manual_seed(0)
    model = _Wide()
    x = torch.randn(4, 32, 512, generator=torch.Generator().manual_seed(1))

    def peak(m, fn):
        return _measured_peak(m, fn, x, lambda out: out.square().mean())

    torch._dynamo.reset()
    plain = torch.compile(copy.deepcopy(model))
    plain(x).square().mean().backward()
    limit = peak(model, plain)
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    ours = memslim.compile(m, peak_memory=limit, strict=True)
    ours(x).square().mean().backward()
    note = _model_note(ours)
    assert ": met" in note, note
    assert peak(m, ours) <= limit, note


class _WideOut(nn.Module):
    """Small parameters, a large output (not a loss): its step peaks where the loss's
    tensors live, at the forward's end and the backward's start."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 1024))

    def forward(self, x):
        return self.f(x)


def test_a_target_at_plain_peak_is_met_where_the_loss_is_the_users():
    # Fuzz seed 941279: a target 329 B above plain torch.compile's step was refused, the
    # verifying step's loss (out * ones_like(out)) holding two tensors of the output's
    # size where a user's, against data it already has, holds one.
    torch.manual_seed(0)
    model = _WideOut()
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    w = torch.randn(256, 1024, generator=torch.Generator().manual_seed(2))  # the loss's data

    def loss(out):
        return (out * w).sum()

    def peak(m, fn):
        return _measured_peak(m, fn, x, loss)

    torch._dynamo.reset()
    plain = torch.compile(copy.deepcopy(model))
    loss(plain(x)).backward()
    limit = peak(model, plain)
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    ours = memslim.compile(m, peak_memory=limit, strict=True)
    loss(ours(x)).backward()
    note = _model_note(ours)
    assert ": met" in note, note
    assert peak(m, ours) <= limit, note


def test_the_verifying_step_leaves_no_gradient_behind():
    # The first step's verifying forward and backward (a loss of its own) accumulated into
    # every leaf but the parameters: an input that requires grad came out of the user's
    # first step with 716x eager's gradient (2026-11-30).
    torch.manual_seed(0)
    model = _Wide()
    extra = torch.randn(512, requires_grad=True)  # a leaf that is no parameter nor input

    def run(m, x):
        (m(x) + extra).square().mean().backward()

    x = torch.randn(4, 32, 512, generator=torch.Generator().manual_seed(1))
    eager = copy.deepcopy(model)
    xe = x.clone().requires_grad_(True)
    run(eager, xe)
    want_extra = extra.grad.clone()
    extra.grad = None
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    ours = memslim.compile(m, peak_memory="1GB", strict=True)
    xo = x.clone().requires_grad_(True)
    run(ours, xo)
    assert ": met" in _model_note(ours)
    torch.testing.assert_close(xo.grad, xe.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(extra.grad, want_extra, rtol=1e-4, atol=1e-6)
    for a, b in zip(m.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)


class _Block(nn.Module):
    def __init__(self, d=128, h=512):
        super().__init__()
        self.f = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))

    def forward(self, x):
        return x + self.f(x)


class _Scriptable(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Sequential(_Block(), _Block(), _Block())

    def forward(self, x):
        return F.mse_loss(self.b(x), torch.zeros_like(x))


def test_memslim_optimize_meets_a_peak_by_measure_or_refuses_it():
    from memslim.budget.torchscript import _step_peak

    x = _x()
    torch.manual_seed(0)
    model = _Scriptable()
    top = _step_peak(torch.jit.script(copy.deepcopy(model)), (x,), {}, _resident(model, x))
    limit = int(0.9 * top)
    m = copy.deepcopy(model)
    ours = memslim.optimize(m, (x,), peak_memory=limit)
    assert _step_peak(ours, (x,), {}, _resident(m, x)) <= limit
    assert any(d.text.startswith("peak_memory") and ": met" in d.text for d in memslim.report(ours))
    ref = copy.deepcopy(model)
    ref(x).backward()
    ours(x).backward()
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)

    with pytest.raises(RuntimeError, match=r"peak_memory [\d,]+ B for the training step") as e:
        memslim.optimize(copy.deepcopy(model), (x,), peak_memory=_resident(model, x) + 1000)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="needs example_inputs"):
        memslim.optimize(copy.deepcopy(model), peak_memory="1GB")
