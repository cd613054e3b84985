"""Which torch.jit executor modes run memslim's registered pre/post passes, and
whether that changes what training saves (docs/measurements.md's executor table).

Runs in a subprocess: executor mode switches and pass registrations are global.
Measured on torch 2.14 with a scripted Linear(256,1024) -> GELU -> Linear MLP,
batch 64, four calls per mode, each mode with a fresh class (scripted modules of
one class share compiled methods and their executors).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import memslim

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, torch, warnings
warnings.filterwarnings("ignore")
import torch.nn.functional as F
import memslim
from memslim import _C

def fresh_mlp():
    class MLP(torch.nn.Module):
        def __init__(s):
            super().__init__(); s.a = torch.nn.Linear(256, 1024); s.b = torch.nn.Linear(1024, 256)
        def forward(s, x):
            return s.b(F.gelu(s.a(x)))
    torch.manual_seed(0)
    return torch.jit.script(MLP())

rows = {}
for profiling in (True, False):
    torch._C._jit_set_profiling_executor(profiling)
    for grad in (True, False):
        for hook in (False, True):
            m = fresh_mlp()
            x = torch.randn(64, 256)
            if hook:
                _C.register_with_graph_executor()
            _C.reset_executor_hook_stats()
            with torch.set_grad_enabled(grad):
                for _ in range(4):
                    y = m(x.detach().requires_grad_(grad))
                    if grad:
                        y.sum().backward()
                saved = memslim.saved_bytes(m, x.detach().requires_grad_(True)) if grad else None
            st = _C.executor_hook_stats()
            _C.unregister_from_graph_executor()
            key = ("profiling" if profiling else "legacy") + "/" + ("grad" if grad else "no_grad") + "/" + ("hook" if hook else "none")
            rows[key] = dict(st, saved=saved)
print(json.dumps(rows))
"""


def test_executor_hooks_do_not_change_training_memory(tmp_path):
    script = tmp_path / "hook_modes.py"  # a file: torch.jit.script reads class sources
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python")},
    )
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    for mode in ("profiling/grad", "profiling/no_grad", "legacy/grad", "legacy/no_grad"):
        assert rows[mode + "/none"]["pre_runs"] == 0
        assert rows[mode + "/hook"]["pre_runs"] >= 1, mode  # every mode runs the hooks ...
        assert rows[mode + "/hook"]["post_runs"] >= 1, mode
    # ... the profiling executor's graphs carry profiled shapes, so sites get rewritten ...
    assert rows["profiling/grad/hook"]["rewrites"] >= 1
    assert rows["profiling/no_grad/hook"]["rewrites"] >= 1
    # ... the legacy executor's do not (every site: "unknown shape") ...
    assert rows["legacy/grad/hook"]["rewrites"] == 0
    # ... and in no mode does the hook change what training saves.
    for mode in ("profiling/grad", "legacy/grad"):
        assert rows[mode + "/hook"]["saved"] == rows[mode + "/none"]["saved"] == 589824, rows


def test_ahead_of_time_optimize_does():
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(256, 1024)
            self.b = torch.nn.Linear(1024, 256)

        def forward(self, x):
            return self.b(F.gelu(self.a(x)))

    torch.manual_seed(0)
    x = torch.randn(64, 256)
    m = MLP()
    assert memslim.saved_bytes(torch.jit.script(m), x) == 589824
    o = memslim.optimize(m, (x,))
    # 262,144 B of GELU output freed: b takes the GELU in and keeps its input.
    assert memslim.saved_bytes(o, x) == 327680
