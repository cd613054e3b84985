"""Peak tensor memory of a training step against the memory budget (issue 12).

Usage: .venv/bin/python bench/budget_peak.py [--models resnet50,bert,gpt2,llama_small]
         [--budgets 0.75,0.5,0.25] [--variants memslim_compile_plan,compile_budget]
         [--batch-vision 8] [--batch-hf 4] [--md bench/results/budget_peak.md]

What: per (model, variant, budget), one process (torch's activation_memory_budget is
process-wide) builds the suite's model (bench/_suite_models.py), trains WARM steps, then
runs one more forward + backward under torch.profiler with profile_memory=True and reports
the highest sum of live CPU tensor allocations during it (c10's allocation and free
events, Inductor's buffers included), counted from the step's start: the step's own peak,
exact and repeatable, where peak RSS (bench/memory_budget.py) moves with the heap's history
(malloc's arenas, the planner's dry runs). Also saved_tensors_hooks' saved bytes.
Why: the issue asks for saved bytes *and* peak monotone in the budget; RSS could not show
the latter either way (memory_budget_compile_session28.md).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WARM = 2


def step_peak_bytes(step) -> int:
    """The highest sum of live CPU allocations during step(), from its start."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def cell(model_name, variant, batch, out):
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, HERE)
    import memslim
    from _suite_models import SPECS, loss_fn, make_variant
    spec = SPECS[model_name]
    torch.manual_seed(0)
    x, target = spec.make_inputs(batch)
    if x.is_floating_point():
        x.requires_grad_(True)
    model = spec.build()
    fn, note = make_variant(variant, model, x.detach())
    params = list(model.parameters())

    def clear():
        for p in params:
            p.grad = None
        x.grad = None

    def step():
        loss_fn(spec, fn(x), target).backward()

    for _ in range(WARM):
        clear()
        step()
    clear()
    peak = step_peak_bytes(step)
    clear()
    saved = memslim.saved_bytes(fn, x)
    with open(out, "w") as f:
        json.dump({"peak": peak, "saved": saved, "note": str(note)[:400]}, f)


def run(model, variant, batch, budget, timeout):
    from memory_budget import run_json
    return run_json(lambda out: [sys.executable, os.path.abspath(__file__), "--cell", model,
                                 variant, str(batch), out], budget, timeout)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--cell":
        cell(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,bert,gpt2,llama_small")
    ap.add_argument("--budgets", default="0.75,0.5,0.25")
    ap.add_argument("--variants", default="memslim_compile_plan,compile_budget")
    ap.add_argument("--batch-vision", type=int, default=8)
    ap.add_argument("--batch-hf", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--md", default=os.path.join(HERE, "results", "budget_peak.md"))
    a = ap.parse_args()
    start = datetime.datetime.now()
    lines = []
    for model in a.models.split(","):
        batch = a.batch_hf if model in ("bert", "gpt2", "llama_small") else a.batch_vision
        for variant in a.variants.split(","):
            for budget in [float(b) for b in a.budgets.split(",")]:
                r = run(model, variant, batch, budget, a.timeout)
                cellv = ("error: " + r["error"]) if "error" in r else \
                    f"{r['saved'] / 1e6:,.1f} MB | {r['peak'] / 1e6:,.1f} MB"
                lines.append(f"| {model} | {variant} | {budget:g} | {cellv} |")
                print(lines[-1], flush=True)
    with open(a.md, "w") as f:
        f.write(f"# Step peak tensor memory against the budget\n\n{start:%Y-%m-%d %H:%M}, "
                f"`bench/budget_peak.py --models {a.models} --budgets {a.budgets} --variants "
                f"{a.variants}` (batch {a.batch_vision} vision, {a.batch_hf}x64 tokens). "
                "Saved: saved_tensors_hooks (distinct storages, parameters excluded). Peak: the "
                "highest sum of live CPU tensor allocations during one forward + backward after "
                f"{WARM} warm-up steps, from the step's start (torch.profiler, profile_memory).\n\n"
                "| model | variant | budget | saved | step peak |\n|---|---|---:|---:|---:|\n" +
                "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
