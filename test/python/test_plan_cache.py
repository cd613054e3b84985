"""The budget planner's plan cache (budget/plan_cache.py): a second process replays.

A small MLP with GELU and LayerNorm under memslim.compile(memory_budget=0.3) in two fresh
processes sharing a plan-cache directory (Inductor's caches fresh in each): the second
process's records say the plan was replayed and it ran no dry-run partition
(budget.measure._partitioned_saved_bytes counted), keeps the same bytes (saved_tensors_hooks)
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

    class MLP(nn.Module):
        def __init__(s):
            super().__init__()
            s.ls = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        def forward(s, x):
            for l in s.ls:
                x = x + F.gelu(l(F.layer_norm(x, (64,))))
            return x.square().sum()

    torch.manual_seed(0)
    m = MLP()
    x = torch.randn(128, 64)
    c = memslim.compile(m, memory_budget=0.3, strict=True)
    c(x).backward()
    grads = [p.grad.flatten().tolist()[:8] for p in m.parameters()]
    texts = [d.text for d in memslim.report(c)]
    print(json.dumps({"dry_runs": calls[0], "replayed": any("replayed from the plan cache" in t
          for t in texts), "saved": memslim.saved_bytes(c, x, warmup=0), "grads": grads}))
    """
)


def _run(tmp_path, tag, cache_dir):
    env = dict(os.environ)
    env.update(
        MEMSLIM_PLAN_CACHE="1",
        MEMSLIM_PLAN_CACHE_DIR=str(cache_dir),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor-{tag}"),
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_replays_the_plan_without_dry_runs(tmp_path):
    first = _run(tmp_path, "a", tmp_path / "plans")
    second = _run(tmp_path, "b", tmp_path / "plans")
    assert first["dry_runs"] >= 2 and not first["replayed"], first
    assert second["dry_runs"] == 0 and second["replayed"], second
    assert second["saved"] == first["saved"]
    assert second["grads"] == first["grads"]
    assert list((tmp_path / "plans").glob("*.json"))


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache's directory should be")
    got = _run(tmp_path, "c", blocked)
    assert got["dry_runs"] >= 2 and not got["replayed"]
    assert got["saved"] > 0
