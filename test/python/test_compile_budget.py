"""memslim.compile(model, memory_budget=B) (issue 12): the budget under torch.compile.

The backend measures what Inductor's partitioner keeps (a dry-run partition);
where that misses the budget it tries fused re-runs (the partitioner's aggressive
min-cut, the light end of the pieces ladder), torch's own activation_memory_budget
knapsack at the fraction meeting the target, then the rest of the pieces ladder,
the FX pipeline and the block ladder as recompute tags until the measured bytes
meet the budget (memslim.budget: ladder._meet_budget). These tests hold it to:
gradients and BatchNorm running stats as eager's (and within plain
torch.compile's own drift), dropout replayed with the forward's mask, measured
bytes at or under the budget and monotone in it, an unreachable budget refused
with the smallest reachable figure, and a budget met as it is left alone.
"""

import pytest
import torch
import torch.nn as nn

import memslim
from memslim.budget import BudgetError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


class SmallResNet(nn.Module):
    def __init__(self, c=8, blocks=4):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()
        )
        self.blocks = nn.Sequential(*[Block(c) for _ in range(blocks)])
        self.head = nn.Linear(c, 5)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class DropMLP(nn.Module):
    def __init__(self, d=64, layers=4):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        for lin in self.lins:
            x = x + self.drop(torch.nn.functional.gelu(lin(x)))
        return x


def _step(model, x):
    for p in model.parameters():
        p.grad = None
    x = x.clone().requires_grad_(True)
    model(x).square().sum().backward()
    return torch.cat([t.flatten() for t in [x.grad] + [p.grad for p in model.parameters()]])


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _budget_notes(compiled):
    """The graph's budget notes (not the model's: budget.model's "the model: ...")."""
    return [
        d
        for d in memslim.report(compiled)
        if d.pass_ == "memory-budget" and not d.text.startswith("the model:")
    ]


def _torch_plan(model):
    """torch.compile with memslim's Inductor guards only: torch's own plan for a budget,
    without the channels-last copies of the saved convolution weights that plain
    torch.compile keeps on the CPU and memslim's backend does not (inductor_guards)."""
    from torch._inductor.compile_fx import compile_fx

    from memslim import inductor_guards

    def guarded(gm, example_inputs):
        return compile_fx(gm, example_inputs, config_patches=inductor_guards.config_patches())

    return torch.compile(model, backend=guarded)


def _copy(model):
    import copy

    return copy.deepcopy(model)


@pytest.mark.parametrize("way", ["knapsack", "ladder"])
@pytest.mark.parametrize("budget", [0.5, 0.2])
def test_budget_keeps_eager_gradients_and_running_stats(budget, way, monkeypatch):
    # Torch's own knapsack (way 2) meets both budgets here; with it refused the pieces
    # ladder (way 3) does: both ways are held to eager's gradients and running stats.
    if way == "ladder":
        from memslim.budget import knapsack

        monkeypatch.setattr(knapsack, "_torch_knapsack", lambda *a: (None, None, None))
    torch.manual_seed(0)
    model = SmallResNet().train()
    x = torch.randn(4, 3, 16, 16)
    eager, plain_m, ours_m = model, _copy(model), _copy(model)
    torch._dynamo.reset()
    plain = torch.compile(plain_m)
    ours = memslim.compile(ours_m, memory_budget=budget, strict=True)
    want = _step(eager, x)
    drift = _rel(_step(plain, x), want)
    got = _step(ours, x)
    assert _rel(got, want) <= max(10 * drift, 1e-5)
    # One more step: the running stats saw two batches, each once.
    for m in (eager, plain, ours):
        _step(m, x)
    for (name, b), b2 in zip(eager.named_buffers(), ours_m.buffers()):
        assert torch.allclose(b.float(), b2.float(), rtol=1e-5, atol=1e-6), name
    [note] = [d for d in _budget_notes(ours) if "budget" in d.text]
    assert note.bytes_after <= budget * note.bytes_before
    if way == "ladder":
        assert "ladder step" in note.text  # the pipeline alone cannot reach these budgets
    else:
        # torch.compile's own plan at the same budget: the same bytes, to the byte.
        from torch._functorch import config as functorch_config

        assert "knapsack at" in note.text, note.text
        with functorch_config.patch(activation_memory_budget=budget):
            torch._dynamo.reset()
            torch_budget = _torch_plan(_copy(model))
            want_bytes = memslim.saved_bytes(torch_budget, x)
        assert memslim.saved_bytes(ours, x) == want_bytes


def test_knapsack_at_a_smaller_fraction_where_torchs_own_misses():
    # At 0.3 torch.compile's own plan keeps 176,832 B of this partition, over the
    # 173,472 B target; way 2 then takes the largest fraction k / 32 whose plan meets it
    # (0.28125) before the pieces ladder: torch.compile's plan at that fraction, to the
    # byte, fewer bytes than torch.compile at 0.3, and eager's gradients.
    from memslim.budget import knapsack
    from torch._functorch import config as functorch_config

    torch.manual_seed(0)
    model = SmallResNet().train()
    x = torch.randn(4, 3, 16, 16)
    eager, ours_m = model, _copy(model)
    torch._dynamo.reset()
    ours = memslim.compile(ours_m, memory_budget=0.3, strict=True)
    want = _step(eager, x)
    got = _step(ours, x)
    assert _rel(got, want) <= 1e-5
    [note] = [d for d in _budget_notes(ours) if "budget" in d.text]
    assert "the largest fraction found" in note.text, note.text
    assert note.bytes_after <= 0.3 * note.bytes_before
    frac = float(note.text.split("knapsack at ")[1].split(",")[0])
    assert frac < 0.3 and frac * knapsack.KNAPSACK_GRID == round(frac * knapsack.KNAPSACK_GRID)
    kept = {}
    for f in (frac, 0.3):
        with functorch_config.patch(activation_memory_budget=f):
            torch._dynamo.reset()
            kept[f] = memslim.saved_bytes(_torch_plan(_copy(model)), x)
    assert memslim.saved_bytes(ours, x) == kept[frac] < kept[0.3]


def _decoder_step(model, ids):
    for p in model.parameters():
        p.grad = None
    model(ids, ids).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def _gflop(text, after):
    return float(text.split(after)[1].split(" GFLOP")[0].split()[-1])


@pytest.mark.parametrize("forced", [False, True], ids=["natural", "cliff"])
def test_a_knapsack_below_the_users_fraction_is_weighed_against_the_pieces_ladder(
    forced, monkeypatch
):
    # Issue 48's least time: where torch's plan at the user's fraction misses the target
    # and a smaller fraction's meets it, way 3's first step meeting the target is measured
    # too and the plan running fewer matrix-product flops is taken. natural: the decoder
    # at 0.7, where torch's knapsack at 0.6875 runs fewer flops than the ladder's step
    # (2026-11-30: 0.0425 against 0.0438 GFLOP), is kept, with a note. cliff: torch's
    # knapsack made to answer at 1/32 (a real plan, re-running most of the forward's
    # matrix products), as GPT-2 small's falls from 190.9 MB at 0.5 to 14.4 MB at
    # 0.09375: the ladder's step is taken, nearer the target, with eager's gradients.
    from memslim._models import tiny_decoder
    from memslim.budget import knapsack

    if forced:
        real = knapsack._torch_knapsack

        def cliff(aten, fakes, skip, frac, *a, **k):
            low, got, _ = real(aten, fakes, skip, 1 / knapsack.KNAPSACK_GRID, *a, **k)
            return low, got, got

        monkeypatch.setattr(knapsack, "_torch_knapsack", cliff)
    torch.manual_seed(0)
    model = tiny_decoder(depth=2, dim=64, hidden=160, vocab=256)
    ids = torch.randint(0, 256, (2, 32))
    eager, ours_m = model, _copy(model)
    torch._dynamo.reset()
    ours = memslim.compile(ours_m, memory_budget=0.7, strict=True)
    assert _rel(_decoder_step(ours, ids), _decoder_step(eager, ids)) <= 1e-5
    [note] = [d for d in _budget_notes(ours) if d.text.startswith("budget")]
    assert note.bytes_after <= 0.7 * note.bytes_before
    assert memslim.saved_bytes(ours, ids, ids) == note.bytes_after
    if not forced:
        assert "met by torch's own activation_memory_budget knapsack at" in note.text
        assert "the largest fraction found" in note.text, note.text
        [weighed] = [d.text for d in _budget_notes(ours) if "meets the target too" in d.text]
        assert _gflop(weighed, "keeps ") >= _gflop(weighed, "knapsack at ")
        return
    assert "the least added work" in note.text, note.text
    assert _gflop(note.text, "partition runs") < _gflop(note.text, "and runs")
    knapsack_kept = int(note.text.split("), keeps ")[1].split(" B")[0].replace(",", ""))
    assert knapsack_kept < note.bytes_after  # the ladder's step stops nearer the target


def test_only_ops_that_draw_keep_torchs_knapsack_out():
    # Way 2 is skipped in graphs that draw random numbers; a dropout or an attention
    # with p = 0 (what transformers' configs with zero rates trace to) draws nothing.
    from memslim.budget.knapsack import _draws_random_numbers

    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    cases = [
        (aten.dropout.default, (x, 0.0, True), {}, False),
        (aten.dropout.default, (x, 0.1, True), {}, True),
        (aten.dropout.default, (x, 0.1, False), {}, False),
        (aten.native_dropout.default, (x, 0.0, True), {}, False),
        (aten.native_dropout.default, (x, 0.5, True), {}, True),
        (aten.scaled_dot_product_attention.default, (x, x, x), {}, False),
        (aten.scaled_dot_product_attention.default, (x, x, x, None, 0.0), {}, False),
        (aten.scaled_dot_product_attention.default, (x, x, x), {"dropout_p": 0.1}, True),
        (aten.bernoulli.p, (x, 0.0), {}, True),
        (aten.rand_like.default, (x,), {}, True),
        (aten.add.Tensor, (x, x), {}, False),
    ]
    for target, args, kwargs, draws in cases:
        node = g.call_function(target, args, kwargs)
        assert _draws_random_numbers(node) == draws, (target, args, kwargs)


class EmbedMLP(nn.Module):
    """A large embedding table among the inputs: torch's activation_memory_budget counts
    it in its size estimate of the graph inputs and returns its default plan at every
    fraction above 0, as on the transformers models."""

    def __init__(self, vocab=20000, d=32, layers=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lins = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))

    def forward(self, ids):
        x = self.emb(ids)
        for lin in self.lins:
            x = x + torch.nn.functional.gelu(lin(x))
        return x


def test_an_inert_torch_budget_is_said_and_the_ladder_meets_the_target():
    torch.manual_seed(0)
    model = EmbedMLP().train()
    ids = torch.randint(0, 20000, (4, 64))
    torch._dynamo.reset()
    ours = memslim.compile(_copy(model), memory_budget=0.5, strict=True)
    ours(ids).sum().backward()
    notes = _budget_notes(ours)
    assert any("torch's budget does nothing on this graph" in d.text for d in notes), notes
    [note] = [d for d in notes if d.text.startswith("budget")]
    assert "knapsack at" not in note.text and note.bytes_after <= 0.5 * note.bytes_before


def test_measured_bytes_fall_with_the_budget():
    torch.manual_seed(1)
    model = SmallResNet(blocks=6).train()
    x = torch.randn(2, 3, 16, 16)
    kept = []
    for budget in (0.75, 0.5, 0.25):
        torch._dynamo.reset()
        ours = memslim.compile(model, memory_budget=budget, strict=True)
        ours(x)
        [note] = [d for d in _budget_notes(ours) if "budget" in d.text]
        assert note.bytes_after <= budget * note.bytes_before
        kept.append(note.bytes_after)
    assert kept == sorted(kept, reverse=True) and kept[-1] < kept[0]
    # The same measurement through saved_tensors_hooks: less kept at 0.25 than plain
    # torch.compile keeps.
    torch._dynamo.reset()
    plain = torch.compile(model)
    assert memslim.saved_bytes(ours, x) < memslim.saved_bytes(plain, x)


def test_recomputed_dropout_replays_the_forward_mask():
    # fallback_random: Inductor draws with aten's generator, so eager with the same
    # seed draws the same masks; a block re-run in backward with another mask would
    # give other gradients.
    from torch._inductor import config as inductor_config

    # Each recomputed dropout keeps the generator's state (5 KB on the CPU): the
    # activations must outweigh it for a budget to be reachable.
    torch.manual_seed(2)
    model = DropMLP().train()
    x = torch.randn(256, 64)
    with inductor_config.patch(fallback_random=True):
        torch._dynamo.reset()
        ours = memslim.compile(model, memory_budget=0.3, strict=True)
        torch.manual_seed(5)
        got = _step(ours, x)
        torch.manual_seed(5)
        want = _step(model, x)
    assert _rel(got, want) <= 1e-5
    assert any("ladder step" in d.text for d in _budget_notes(ours))


def test_unreachable_budget_names_the_smallest_reachable():
    torch.manual_seed(3)
    model = SmallResNet(blocks=2).train()
    x = torch.randn(2, 3, 16, 16)
    torch._dynamo.reset()
    ours = memslim.compile(model, memory_budget=1e-4, strict=True)
    # The budget is the model's (budget/model.py): refused at the end of the forward,
    # naming the model's smallest figure (here its one graph's).
    with pytest.raises(
        BudgetError, match=r"cannot be met: the smallest reachable found is [\d,]+ B"
    ):
        ours(x)
    # The graph stays in the model's report, with why its share failed.
    notes = [d for d in memslim.report(ours) if d.text.startswith("the graph's share not met: ")]
    assert notes and all(
        d.pass_ == "memory-budget" and "the smallest reachable is" in d.text for d in notes
    )


def test_budget_met_as_it_is_rewrites_nothing():
    torch.manual_seed(4)
    model = SmallResNet(blocks=2).train()
    x = torch.randn(2, 3, 16, 16)
    torch._dynamo.reset()
    ours = memslim.compile(model, memory_budget=1.0, strict=True)
    _step(ours, x)
    # The planning forward's measure may add its own record (this model's graph saves
    # 10,080 B beyond its dry run's 158,080 B: docs/facts.md); the plan's notes say met.
    notes = [d for d in _budget_notes(ours) if not d.text.startswith("measured:")]
    assert notes and all("met as it is, nothing rewritten" in d.text for d in notes)


def test_export_refuses_a_budget_with_a_clear_error():
    model = SmallResNet(blocks=1).train()
    ep = torch.export.export(model, (torch.randn(2, 3, 8, 8),))
    with pytest.raises((ValueError, TypeError), match="memory_budget"):
        memslim.fx.optimize(ep, memory_budget=0.5)


class Seed926027(nn.Module):
    """Fuzz seed 926027 (test/fuzz, compile-budget leg): the whole graph is one block,
    starting at `x * 1.0`, which Inductor's joint passes replace by x itself."""

    def __init__(self):
        super().__init__()
        self.g0 = nn.Parameter(1.0 + torch.randn(16) * 0.1)
        self.rm0 = nn.Buffer(torch.randn(16) * 0.1)
        self.rv0 = nn.Buffer(torch.rand(16) + 0.5)
        self.g1 = nn.Parameter(
            torch.where(torch.rand(16) < 0.3, torch.zeros(16), torch.randn(16) * 0.05)
        )
        self.b0 = nn.Parameter(torch.randn(16) * 0.1)
        self.norm0 = nn.LayerNorm(16)

    def forward(self, x):
        F = torch.nn.functional
        v1 = x * 1.0
        for _ in range(2):
            v1 = v1 / (v1.abs() + 1.0) + v1 * 0.5
        v5 = v1.narrow(1, 0, 1)
        c = x - x.mean(-1, keepdim=True)
        v6 = c * torch.rsqrt((c * c).mean(-1, keepdim=True) + 1e-6) * self.g0
        v6.add_(x, alpha=0.5)
        v7 = F.selu(v1)
        v10 = v5 * torch.tanh(F.softplus(v5))
        v12 = F.batch_norm(v7, self.rm0, self.rv0, self.g1, self.b0, training=self.training)
        v14 = self.norm0(v12 * F.leaky_relu(x, 0.2))
        return v14 + v10.sum() * 0.0 + F.celu(v7, alpha=1.5).mean()


def test_a_run_starting_at_an_input_keeps_the_input():
    # The run's first node, x * 1.0, is replaced by x in Inductor's joint passes, which
    # percolate its MUST_RECOMPUTE tag onto the input x: the partitioner then kept neither
    # x nor what backward computes from it ("Node add_21 was invalid, but is output").
    # 0.95 of the partition is reachable by tagging the one block (0.909 is the
    # smallest reachable figure); 0.5 is not.
    torch.manual_seed(926027)
    model = Seed926027().eval()
    x = torch.randn(8, 16)
    torch._dynamo.reset()
    ours = memslim.compile(model, memory_budget=0.95, strict=True)

    def step(m):  # g0 is unused (its v6 is dead): a None gradient counts as zeros
        for p in model.parameters():
            p.grad = None
        xx = x.clone().requires_grad_(True)
        m(xx).square().sum().backward()
        return torch.cat(
            [
                t.flatten()
                for t in [xx.grad]
                + [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
            ]
        )

    got = step(ours)
    notes = [d.text for d in _budget_notes(ours)]
    assert any("ladder step 1 " in t for t in notes), notes
    want = step(model)
    assert _rel(got, want) <= 1e-5
    torch._dynamo.reset()
    with pytest.raises(Exception, match="smallest reachable"):
        step(memslim.compile(model, memory_budget=0.5, strict=True))


def test_budget_figure_counts_storages_as_the_hooks_do():
    # The budget's figure (a dry-run partition) counts what saved_tensors_hooks count:
    # each storage once, parameters and views of them out. By saved values' sizes it also
    # counted the transposed weights the partitioner saves for each Linear (bert: 491.7 MB
    # against the hooks' 152 MB), and the planner minimised weight views.
    import memslim.backend as mb
    from memslim.budget.measure import _partitioned_saved_bytes
    from torch._inductor.compile_fx import compile_fx

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    x = torch.randn(32, 64)
    figure = []

    def backend(gm, example_inputs):
        aten, _, fakes = mb._aten_graph(gm, example_inputs)
        skip = {i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)}
        figure.append(_partitioned_saved_bytes(aten, fakes, skip))
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    hooks = memslim.saved_bytes(compiled, x)
    torch._dynamo.reset()
    weights = sum(p.numel() * 4 for n, p in model.named_parameters() if n.endswith("weight"))
    assert figure and figure[0] == hooks, (figure, hooks)
    assert hooks < weights  # the weights' views alone would be more than the whole figure


class FracBlock(Block):
    """Block with FracAct (seed 000's hand-written activation) in place of ReLU: most of
    what eager keeps is the activation's intermediates, which a re-run recomputes
    without any convolution."""

    def __init__(self, c):
        super().__init__(c)
        from memslim._models import FracAct

        self.a1, self.a2 = FracAct(), FracAct()

    def forward(self, x):
        return self.a2(x + self.b2(self.c2(self.a1(self.b1(self.c1(x))))))


def test_fused_re_runs_are_taken_whole_as_torch_takes_them():
    # The light end of the pieces ladder (norms and activations re-run, no convolution)
    # meets 0.75 and 0.6: the planner takes all of it at both, as torch's partitioner
    # takes its most aggressive min-cut of fusible ops once that meets the budget.
    # Before, the ladder stopped at the first step meeting the budget and kept more than
    # torch.compile at the same budget (resnet50_frac in the suite at 0.5: 0.31 of eager
    # against 0.10).
    torch.manual_seed(6)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), FracBlock(8), FracBlock(8)).train()
    x = torch.randn(2, 3, 16, 16)
    kept = []
    for budget in (0.75, 0.6):
        torch._dynamo.reset()
        ours = memslim.compile(_copy(model), memory_budget=budget, strict=True)
        got = _step(ours, x)
        [note] = [d for d in _budget_notes(ours) if "budget" in d.text]
        assert "taken whole" in note.text, note.text
        assert note.bytes_after <= budget * note.bytes_before
        kept.append(note.bytes_after)
    assert kept[0] == kept[1]
    # FracAct's gradient is singular at 0+: compare on the first step only, with plain
    # torch.compile's drift as the scale.
    torch._dynamo.reset()
    want = _step(_copy(model), x)
    drift = _rel(_step(torch.compile(_copy(model)), x), want)
    assert _rel(got, want) <= max(10 * drift, 1e-5)


def test_planner_leaves_no_more_fx_sources_than_torch_compile():
    # FX keeps every compiled GraphModule's source for the process's life
    # (torch.fx.graph_module._loader.eval_cache). The planner's dry runs and ladder
    # retags made ~9 such modules at 0.1 here that nothing runs: resident memory grew
    # with the probes, so a smaller budget left more behind (resnet50: 6 MiB). One more
    # than plain torch.compile: memslim's own aten graph, which the compile runs.
    # Both compile cold: a cache hit skips Inductor's own GraphModules (the cache key's
    # recompiles, the backward's deepcopy), so with plain torch.compile's graph cached
    # by an earlier test and ours not, the count compared cache states (CI, stop 39:
    # 11 against 2; both cold: 7 against 6).
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch.fx import graph_module as fx_gm

    torch.manual_seed(0)
    model = SmallResNet().train()
    x = torch.randn(4, 3, 16, 16)

    def added(compiled):
        n = len(fx_gm._loader.eval_cache)
        torch._dynamo.reset()
        with (
            inductor_config.patch(fx_graph_cache=False),
            functorch_config.patch(enable_autograd_cache=False),
        ):
            _step(compiled, x)
        return len(fx_gm._loader.eval_cache) - n

    plain = added(torch.compile(_copy(model)))
    ours = added(memslim.compile(_copy(model), memory_budget=0.1, strict=True))
    assert ours <= plain + 1, (ours, plain)


def _dry_runs(monkeypatch):
    """Counts the budget's dry-run partitions and AOTAutograd's joint traces among them."""
    import torch._functorch.aot_autograd as aot

    from memslim.budget import ladder, measure

    import sys

    counts = {"dry runs": 0, "traces": 0, "dry-run traces": 0}
    real, trace = measure._partitioned_saved_bytes, aot.aot_module_simplified

    def counted(*a, **k):
        counts["dry runs"] += 1
        return real(*a, **k)

    def traced(*a, **k):
        counts["traces"] += 1  # (the compile's own too, where it looks the function up)
        if sys._getframe(1).f_code.co_filename.endswith("measure.py"):
            counts["dry-run traces"] += 1
        return trace(*a, **k)

    for module in (measure, ladder):
        monkeypatch.setattr(module, "_partitioned_saved_bytes", counted)
    from memslim.budget import knapsack

    monkeypatch.setattr(knapsack, "_partitioned_saved_bytes", counted)
    monkeypatch.setattr(aot, "aot_module_simplified", traced)
    return counts


def test_dry_runs_share_one_joint_and_measure_what_a_traced_one_does(monkeypatch):
    # budget.measure.shared_joints: the unmodified graph's partition, FUSED_RECOMPUTE's and
    # torch's knapsack differ only in the partitioner's options, so they split copies of
    # one joint; their figures (bytes and the predictor's live peaks) must be a traced
    # one's to the byte, and a graph whose recompute tags changed is traced again.
    import contextlib

    from torch._functorch import config as functorch_config
    from torch.utils.checkpoint import CheckpointPolicy

    from memslim._models import tiny_decoder
    from memslim.backend import _aten_graph
    from memslim.budget import measure
    from memslim.budget.knapsack import FUSED_RECOMPUTE, TORCH_KNAPSACK

    counts = _dry_runs(monkeypatch)
    options = [{}, dict(FUSED_RECOMPUTE), dict(TORCH_KNAPSACK, activation_memory_budget=0.3)]
    seen = {}

    def figures(aten, fakes, skip, shared):
        out = []
        counts["traces"] = 0
        with measure.shared_joints() if shared else contextlib.nullcontext():
            for o in options:
                with functorch_config.patch(**o):
                    p = measure._partitioned_saved_bytes(aten, fakes, skip)
                out.append((int(p), p.profile()))
            silu = next(n for n in aten.graph.nodes if "silu" in str(n.target))
            silu.meta.update(recompute=CheckpointPolicy.MUST_RECOMPUTE, ac_graph_id=99)
            try:
                with functorch_config.patch(**FUSED_RECOMPUTE):
                    p = measure._partitioned_saved_bytes(aten, fakes, skip)
            finally:
                del silu.meta["recompute"], silu.meta["ac_graph_id"]
            out.append((int(p), p.profile()))
        return out, counts["traces"]

    def backend(gm, example_inputs):
        aten, _, fakes = _aten_graph(gm, example_inputs)
        skip = {i for i, t in enumerate(example_inputs) if isinstance(t, nn.Parameter)}
        seen["traced"] = figures(aten, fakes, skip, shared=False)
        seen["shared"] = figures(aten, fakes, skip, shared=True)
        return gm

    model = tiny_decoder(depth=1, dim=64, hidden=160, vocab=256)
    ids = torch.randint(0, 256, (2, 32))
    torch._dynamo.reset()
    torch.compile(model, backend=backend)(ids, ids).backward()
    (traced, n_traced), (shared, n_shared) = seen["traced"], seen["shared"]
    assert shared == traced
    assert len({b for b, _ in traced}) >= 3, traced  # the options and the tag do differ
    assert (n_traced, n_shared) == (4, 2)


def test_a_budget_met_by_torchs_knapsack_plans_in_three_dry_runs(monkeypatch):
    # Issue 48: at most three dry-run partitions per graph. A decoder at 0.5 is met by
    # torch's knapsack: the unmodified graph, the light end of the pieces ladder (which
    # misses, so the partitioner alone is not measured) and the knapsack's plan; the
    # untagged two share one joint trace.
    from memslim._models import tiny_decoder

    counts = _dry_runs(monkeypatch)
    model = tiny_decoder(depth=2, dim=64, hidden=160, vocab=256)
    ids = torch.randint(0, 256, (2, 32))
    torch._dynamo.reset()
    ours = memslim.compile(model, memory_budget=0.5, strict=True)
    ours(ids, ids).backward()
    [note] = [d for d in _budget_notes(ours) if d.text.startswith("budget")]
    assert "knapsack" in note.text, note.text
    assert note.bytes_after <= 0.5 * note.bytes_before
    assert counts["dry runs"] == 3, counts
    # budget.partitioner: the planner ran inside the compile's partition step, each dry
    # run a min-cut of a copy of the compile's own joint (no dry run traced), and the
    # graph compiled is the one the plan measured: its saved bytes, counted by the hooks
    # in the planning forward, are the plan's to the byte.
    assert counts["dry-run traces"] == 0, counts
    [model] = [d.text for d in memslim.report(ours) if d.text.startswith("the model:")]
    assert f"the compiled graphs saved {note.bytes_after:,} B in the planning forward" in model


def test_a_plan_needing_the_pipelines_graph_is_planned_on_a_fresh_trace(monkeypatch):
    # budget.partitioner: the planner runs inside the compile's partition step, on the
    # joint the compile traced; a way that rewrites the graph (the pipeline's rewrites,
    # way 4, and the whole-block ladder over them, way 5) needs another trace, so its dry
    # run raises Retrace out of the compile and the backend plans the old way, on a fresh
    # trace. Here ways 1-3 are taken away (no pieces ladder, no knapsack): the plan is
    # the pipeline's, its records written once, its gradients eager's and its bytes, as
    # the hooks count them in the planning forward, the plan's.
    from memslim import backend
    from memslim.budget import knapsack

    monkeypatch.setattr(knapsack, "_torch_knapsack", lambda *a: (None, None, None))
    monkeypatch.setattr(backend, "_Lazy", lambda build: backend._NoLadder())
    counts = _dry_runs(monkeypatch)
    torch.manual_seed(0)
    model = SmallResNet().train()
    x = torch.randn(4, 3, 16, 16)
    eager, ours_m = model, _copy(model)
    torch._dynamo.reset()
    ours = memslim.compile(ours_m, memory_budget=0.5, strict=True)
    want = _step(eager, x)
    got = _step(ours, x)
    assert _rel(got, want) <= 1e-5
    notes = [d.text for d in _budget_notes(ours)]
    [note] = [d for d in _budget_notes(ours) if d.text.startswith("budget")]
    assert "pipeline" in note.text or "ladder step" in note.text, note.text
    assert len(notes) == len(set(notes)), notes  # the aborted planning left nothing
    assert counts["dry-run traces"] >= 1, counts  # the old way's
    [model_note] = [d.text for d in memslim.report(ours) if d.text.startswith("the model:")]
    assert f"saved {note.bytes_after:,} B in the planning forward" in model_note, model_note


def test_torchs_knapsack_sees_dynamos_static_inputs():
    # AOTAutograd treats the inputs Dynamo marks static (parameters and buffers) as free
    # to save; memslim's aten graph (make_fx's trace of Dynamo's) carries those marks
    # (backend._dynamos_inputs), so torch's knapsack at a fraction keeps what
    # torch.compile's keeps at it, to the byte. Before, a BERT from a config kept its
    # embeddings' sum (4 x 32 x 64 floats, 32,768 B more) where torch.compile keeps the
    # position-id buffer and re-runs the embeddings.
    transformers = pytest.importorskip("transformers")
    from torch._functorch import config as functorch_config

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )

    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel(cfg, add_pooling_layer=False)

        def forward(self, ids):
            return self.bert(input_ids=ids).last_hidden_state

    model = Hidden()
    ids = torch.randint(0, 512, (4, 32))
    torch._dynamo.reset()
    theirs = torch.compile(_copy(model))
    with functorch_config.patch(activation_memory_budget=0.25):
        theirs(ids).sum().backward()
    ours = memslim.compile(_copy(model), memory_budget=0.25, strict=True)
    ours(ids).sum().backward()
    [note] = [d for d in _budget_notes(ours) if d.text.startswith("budget")]
    assert "knapsack at 0.25 (" in note.text, note.text
    assert memslim.saved_bytes(ours, ids) == memslim.saved_bytes(theirs, ids) == note.bytes_after
