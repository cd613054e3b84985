"""Every decision record of the benchmark suite's 13 models, through each way in.

What: builds each model of bench/_suite_models.py's FULL_MODELS (small inputs: batch 2,
32x32 images, 32 tokens), and prints the str() of every decision record memslim makes
for it through TorchScript (memslim.optimize on the scripted or traced module), torch.export
(memslim.fx.optimize) and torch.compile (memslim.compile, one forward + backward), plus the
TorchScript planner at memory_budget 0.5. One block per (model, way), records in order.
Opt-in (--ways compile_budget): memslim.compile at memory_budget 0.5, the compile planner.
Why: a restructuring of the passes, the driver or the planner must not change a decision;
this output, diffed before and after, is the proof. Deterministic: no times, no addresses.

    .venv/bin/python scripts/dump_records.py > before.txt          # all models
    .venv/bin/python scripts/dump_records.py resnet18 gpt2 --ways script,export
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings

os.environ.setdefault("MEMSLIM_SUITE_IMG", "32")
os.environ.setdefault("MEMSLIM_SUITE_HF_SEQ", "32")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import torch  # noqa: E402

import _suite_models as suite  # noqa: E402
import memslim  # noqa: E402

warnings.filterwarnings("ignore")
WAYS = ("script", "export", "compile", "script_budget")
EXTRA_WAYS = ("compile_budget",)  # not in the default run (dry-run partitions: slow)
BATCH = 2


def _records(name: str, way: str):
    spec = suite.SPECS[name]
    torch.manual_seed(0)
    model = suite.zero_dropout(spec.build())
    x, target = spec.make_inputs(BATCH)
    if way in ("script", "script_budget"):
        scripted, _ = suite.script_or_trace(model, x)
        kwargs = {"memory_budget": 0.5} if way == "script_budget" else {}
        return memslim.report(memslim.optimize(scripted, (x,), **kwargs))
    if way == "export":
        return memslim.report(memslim.fx.optimize(torch.export.export(model, (x,))))
    torch._dynamo.reset()
    kwargs = {"memory_budget": 0.5} if way == "compile_budget" else {}
    compiled = memslim.compile(model, strict=True, **kwargs)
    suite.loss_fn(spec, compiled(x), target).backward()
    return memslim.report(compiled)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="suite model names (default: all 13)")
    ap.add_argument(
        "--ways", default=",".join(WAYS), help="comma list of " + ", ".join(WAYS + EXTRA_WAYS)
    )
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    ways = [w for w in args.ways.split(",") if w]
    bad = [w for w in ways if w not in WAYS + EXTRA_WAYS] + [
        m for m in args.models if m not in suite.SPECS
    ]
    if bad:
        print(f"dump_records: unknown way or model: {', '.join(bad)}", file=sys.stderr)
        return 1
    if not args.one:
        # One process per model: what TorchScript scripts (or falls back to tracing) and
        # what Dynamo caches must not depend on the models run before it.
        for name in args.models or suite.FULL_MODELS:
            sys.stdout.flush()
            cmd = [sys.executable, os.path.abspath(__file__), name, "--one", "--ways", args.ways]
            if subprocess.run(cmd).returncode != 0:
                print(f"=== {name}: the worker process failed")
        return 0
    for name in args.models:
        for way in ways:
            print(f"=== {name} / {way}", flush=True)
            try:
                for d in _records(name, way):
                    print(str(d))
            except Exception as e:  # a failure is part of the output, not the end of it
                first = (str(e).strip().splitlines() or [""])[0]
                print(f"FAILED: {type(e).__name__}: {first}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
