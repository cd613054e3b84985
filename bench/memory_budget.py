"""memory_budget against torch.compile's activation_memory_budget, side by side (issue 12).

Usage: .venv/bin/python bench/memory_budget.py [--models resnet50,bert,gpt2,llama_small]
         [--budgets 0.75,0.5,0.25] [--batch-vision 8] [--batch-hf 4] [--md bench/results/memory_budget.md]

Per (model, budget), three suite workers (bench/_suite_worker.py, one process each, 1 torch
thread): memslim.optimize(memory_budget=B) on the scripted / traced model,
memslim.compile(model, memory_budget=B) (memslim's planner under torch.compile: B of what
Inductor's partitioner keeps, blocks recomputed through recompute tags), and torch.compile
with torch._functorch.config.activation_memory_budget = B. Each worker measures saved-for-
backward bytes (saved_tensors_hooks, distinct storages, parameters excluded), its peak RSS,
and its step time (forward + backward) interleaved with an eager copy of the same model in
the same process (median of 5 pairs): the table's time columns are those ratios to eager.
Plus one eager and one scripted worker per model for the reference figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(argv, budget, timeout):
    """Runs `argv(out)` (a command writing its JSON result to the path `out`) in a process
    of its own with MEMSLIM_SUITE_BUDGET=budget and 1 OpenMP thread; its result, or
    {"error": why}. Also bench/budget_peak.py's cells."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        env = dict(os.environ, MEMSLIM_SUITE_BUDGET=str(budget), OMP_NUM_THREADS="1")
        try:
            p = subprocess.run(argv(out), env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out ({timeout} s)"}
        if not os.path.exists(out):
            return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:200]}
        with open(out) as f:
            return json.load(f)


def run(model, variant, batch, budget, timeout):
    return run_json(
        lambda out: [
            sys.executable,
            os.path.join(HERE, "_suite_worker.py"),
            model,
            variant,
            "--batch",
            str(batch),
            "--out",
            out,
            "--threads",
            "1",
        ],
        budget,
        timeout,
    )


def mb(b):
    return f"{b / 1e6:,.1f} MB" if b is not None else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,bert,gpt2,llama_small")
    ap.add_argument("--budgets", default="0.75,0.5,0.25")
    ap.add_argument("--batch-vision", type=int, default=8)
    ap.add_argument("--batch-hf", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--md", default=os.path.join(HERE, "results", "memory_budget.md"))
    ap.add_argument("--json", default="", help="also write the workers' raw results here")
    ap.add_argument(
        "--variants",
        default="optimize,compile",
        help="'optimize' adds the memslim.optimize column's workers",
    )
    a = ap.parse_args()
    rows = []
    start = datetime.datetime.now()
    for model in a.models.split(","):
        batch = a.batch_hf if model in ("bert", "gpt2", "llama_small") else a.batch_vision
        eager = run(model, "eager", batch, 1.0, a.timeout)
        script = run(model, "script", batch, 1.0, a.timeout)
        for budget in [float(b) for b in a.budgets.split(",")]:
            ms = (
                run(model, "memslim_budget", batch, budget, a.timeout)
                if "optimize" in a.variants
                else {"error": "not run"}
            )
            mc = run(model, "memslim_compile_plan", batch, budget, a.timeout)
            tc = run(model, "compile_budget", batch, budget, a.timeout)
            rows.append((model, batch, budget, eager, script, ms, mc, tc))
            print(
                model,
                budget,
                ms.get("saved_bytes"),
                ms.get("step_ratio"),
                ms.get("error", ""),
                mc.get("saved_bytes"),
                mc.get("step_ratio"),
                mc.get("error", ""),
                tc.get("saved_bytes"),
                tc.get("step_ratio"),
                tc.get("error", ""),
                flush=True,
            )
    lines = [
        "# memory_budget: memslim.optimize and memslim.compile against torch.compile's activation_memory_budget",
        "",
        f"{start:%Y-%m-%d %H:%M}, `bench/memory_budget.py --models {a.models} --budgets {a.budgets} "
        f"--batch-vision {a.batch_vision} --batch-hf {a.batch_hf}`; one process per cell, 1 torch "
        "thread, fp32 CPU training, dropout 0 (the suite's models). Saved bytes: "
        "saved_tensors_hooks, distinct storages, parameters excluded. Step: forward + backward, "
        "median of 5 pairs interleaved with an eager copy in the same process, as a ratio to that "
        "eager copy. Step peak RSS: the worker's high-water mark over its last training step, reset "
        "(malloc_trim, /proc/self/clear_refs 5) after the warm-up steps, so memslim's planning and "
        "torch.compile's compilation are not in it; (+N): its rise above the RSS at the reset.",
        "",
        "| model | batch | budget | eager saved | scripted saved | memslim.optimize saved (x eager) | peak RSS | step | memslim.compile saved (x eager) | peak RSS | step | torch.compile saved (x eager) | peak RSS | step | memslim.compile faster? | memslim.compile keeps less? |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for model, batch, budget, e, s, m, p, c in rows:
        es = e.get("saved_bytes")

        def cell(r):
            if "error" in r or r.get("saved_bytes") is None:
                why = (
                    r.get("error")
                    or "; ".join(f"{k}: {v}" for k, v in r.get("errors", {}).items())
                    or "no figure"
                )
                return f"error: {why[:90]}", "-", "-"
            x = r["saved_bytes"] / es if es else float("nan")
            peak = r.get("rss_step_peak_mib", 0)
            rise = peak - r.get("rss_base_mib", peak)
            return (
                f"{mb(r['saved_bytes'])} ({x:.3f})",
                f"{peak:,.0f} MiB (+{rise:,.0f})",
                f"x{r['step_ratio']:.2f}" if r.get("step_ratio") else "-",
            )

        mc, pc, cc = cell(m), cell(p), cell(c)
        faster = less = "-"
        if p.get("step_ratio") and c.get("step_ratio"):
            faster = "yes" if p["step_ratio"] < c["step_ratio"] else "no"
        if p.get("saved_bytes") is not None and c.get("saved_bytes") is not None:
            less = "yes" if p["saved_bytes"] <= c["saved_bytes"] else "no"
        lines.append(
            f"| {model} | {batch} | {budget} | {mb(es)} | {mb(s.get('saved_bytes'))} | {mc[0]} | {mc[1]} | "
            f"{mc[2]} | {pc[0]} | {pc[1]} | {pc[2]} | {cc[0]} | {cc[1]} | {cc[2]} | {faster} | {less} |"
        )
    lines += ["", "memslim's plan per cell (its notes):", ""]
    for model, batch, budget, e, s, m, p, c in rows:
        lines.append(
            f"- {model} @ {budget}, memslim.optimize: {m.get('note', m.get('error', ''))[:400]}"
        )
        lines.append(
            f"- {model} @ {budget}, memslim.compile: {p.get('note', p.get('error', ''))[:700]}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                [
                    dict(
                        model=r[0],
                        batch=r[1],
                        budget=r[2],
                        eager=r[3],
                        script=r[4],
                        memslim=r[5],
                        memslim_compile=r[6],
                        compile=r[7],
                    )
                    for r in rows
                ],
                f,
                indent=1,
            )
    with open(a.md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", a.md)


if __name__ == "__main__":
    main()
