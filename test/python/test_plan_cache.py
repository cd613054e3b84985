"""The budget planner's plan cache (budget/plan_cache.py): a second process replays.

A small MLP with GELU and LayerNorm under memslim.compile(memory_budget=0.3) (and, wider,
split in two graphs by a graph break, at 0.6: a model whose first process re-plans) in two fresh
processes sharing a plan-cache directory (Inductor's caches fresh in each): the second
process's records say the plan was replayed and it ran no dry-run partition
(budget.measure._partitioned_saved_bytes counted) nor make_fx trace of Dynamo's graph
(plan_cache.load_graph read it back), keeps the same bytes (saved_tensors_hooks)
and computes the same gradients as the first; a plan cache that cannot be written (a file
where its directory should be) is skipped, the step runs.
"""

import json
import os
import subprocess
import sys
import textwrap


SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, torch.nn as nn, torch.nn.functional as F, memslim
    from memslim.budget import measure
    calls = [0]
    real = measure._partitioned_saved_bytes
    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)
    measure._partitioned_saved_bytes = counted
    import memslim.budget.ladder as ladder, memslim.backend as backend
    ladder._partitioned_saved_bytes = counted
    backend._partitioned_saved_bytes = counted
    loaded = [0]  # aten graphs read from the cache instead of traced (plan_cache.load_graph)
    real_load = backend.plan_cache.load_graph
    def load(*a, **k):
        g = real_load(*a, **k)
        loaded[0] += g is not None
        return g
    backend.plan_cache.load_graph = load

    class MLP(nn.Module):
        def __init__(s, split):
            super().__init__()
            s.ls = nn.ModuleList(nn.Linear(128, 128) for _ in range(6 if split else 4))
            s.out = nn.Linear(128, 2048) if split else None
        def forward(s, x, y):
            for l in s.ls:
                x = x + F.gelu(l(F.layer_norm(x, (128,))))
            if s.out is not None:  # a second graph keeping y (2 MiB), which nothing shrinks
                h = s.out(x)
                torch._dynamo.graph_break()
                return (h * y).sum()
            return x.square().sum()

    if sys.argv[1] == "ladder":  # torch's knapsack off: a plan of ladder tags
        import memslim.budget.knapsack as knapsack
        knapsack._torch_knapsack = lambda *a: (None, None, None)
    torch.manual_seed(0)
    split = sys.argv[1] == "split"
    m = MLP(split)
    x, y = torch.randn(256, 128), torch.randn(256, 2048)
    budget = 0.6 if split else 0.3
    if sys.argv[1] == "ladder":  # a decoder whose plan at 0.9 is the pieces ladder's light end
        from memslim._models import tiny_decoder
        m, budget = tiny_decoder(dim=64, hidden=128, depth=2, vocab=512), 0.9
        x = y = torch.randint(0, 512, (2, 32))
    c = memslim.compile(m, memory_budget=budget, strict=True)
    c(x, y).backward()
    grads = [p.grad.flatten().tolist()[:8] for p in m.parameters()]
    texts = [d.text for d in memslim.report(c)]
    model = [t for t in texts if t.startswith("the model:")]
    print(json.dumps({"dry_runs": calls[0], "loaded": loaded[0], "replayed": any("replayed from the plan cache" in t
          for t in texts), "saved": memslim.saved_bytes(c, x, y, warmup=0), "grads": grads,
          "model": model[-1] if model else ""}))
    """
)


def _run(tmp_path, tag, cache_dir, model="one"):
    env = dict(os.environ)
    env.update(
        MEMSLIM_PLAN_CACHE="1",
        MEMSLIM_PLAN_CACHE_DIR=str(cache_dir),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor-{tag}"),
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, model], env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_replays_the_plan_without_dry_runs(tmp_path):
    first = _run(tmp_path, "a", tmp_path / "plans")
    second = _run(tmp_path, "b", tmp_path / "plans")
    assert first["dry_runs"] >= 2 and not first["replayed"], first
    assert second["dry_runs"] == 0 and second["replayed"], second
    # The aten graph too: read back, not traced again, in the second process only.
    assert first["loaded"] == 0 and second["loaded"] == 1, (first, second)
    assert second["saved"] == first["saved"]
    assert second["grads"] == first["grads"]
    assert list((tmp_path / "plans").glob("*.json"))


def test_a_second_process_plans_a_split_model_in_one_forward(tmp_path):
    """The model's shares are kept too (plan_cache.store_model): where the first process
    re-planned its first forward (graph 1 cannot meet its share), the second plans it once."""
    first = _run(tmp_path, "s1", tmp_path / "plans", "split")
    second = _run(tmp_path, "s2", tmp_path / "plans", "split")
    assert "met, after 2 forwards (re-planned)" in first["model"], first["model"]
    assert second["model"].endswith(": met"), second["model"]
    assert second["loaded"] == 2, second  # both graphs' traces read back
    assert second["dry_runs"] == 0 and second["replayed"], second
    assert second["saved"] == first["saved"]
    assert second["grads"] == first["grads"]


def test_a_replayed_ladder_plan_compiles_its_tags(tmp_path):
    """A plan of ladder tags replayed in a process whose Inductor cache is empty: the
    compile's partitioner (budget.partitioner) splits the joint with the plan's tags, so
    the graph saves what the first process's did (before 2026-11-30's fix it read the
    tags while the compile's trace had them off, and split the graph untagged)."""
    first = _run(tmp_path, "l1", tmp_path / "plans", "ladder")
    second = _run(tmp_path, "l2", tmp_path / "plans", "ladder")
    assert second["dry_runs"] == 0 and second["replayed"], second
    assert second["saved"] == first["saved"], (first["saved"], second["saved"])
    assert second["grads"] == first["grads"]


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache's directory should be")
    got = _run(tmp_path, "c", blocked)
    assert got["dry_runs"] >= 2 and not got["replayed"]
    assert got["saved"] > 0


def test_the_graph_key_reads_constants_and_refuses_what_it_cannot_see(tmp_path, monkeypatch):
    """plan_cache.graph_key: a constant's value is part of the key (the aten graph read back
    holds the first process's constants), and a graph whose trace may depend on more than
    the key reads (a submodule call, a symbolic size) has none."""
    import torch

    from memslim.budget import plan_cache

    monkeypatch.setenv("MEMSLIM_PLAN_CACHE", "1")
    monkeypatch.setenv("MEMSLIM_PLAN_CACHE_DIR", str(tmp_path))

    class WithConstant(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.register_buffer("c", torch.tensor([c, 2.0]), persistent=False)

        def forward(self, x):
            return x * self.c

    x = torch.randn(3, 2)
    keys = [plan_cache.graph_key(torch.fx.symbolic_trace(WithConstant(c)), [x]) for c in (1, 1, 3)]
    assert keys[0] is not None and keys[0] == keys[1] and keys[0] != keys[2], keys
    assert plan_cache.graph_key(torch.fx.symbolic_trace(WithConstant(1)), [x.T]) != keys[0]

    class CallsModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

    assert plan_cache.graph_key(torch.fx.symbolic_trace(CallsModule()), [x]) is None
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    symbolic = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(x)  # sizes are symbols
    assert plan_cache.graph_key(torch.fx.symbolic_trace(WithConstant(1)), [symbolic]) is None
