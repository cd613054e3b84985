"""Re-check of the benchmark suite's memslim column after the SafetyGate (issue 9): "the
benchmark suite's saved bytes unchanged or better after the gate".

  .venv/bin/python bench/suite_memslim_recheck.py [--models resnet18,bert] [--jobs 1]

What: for the 13 models of bench/_suite_models.py at the suite's settings (batch 32 x 3x64x64,
transformers 4 x 64 tokens), builds the "memslim" variant exactly as bench/_suite_worker.py
does (make_variant), trains the same WARM_STEPS + STEADY_STEPS SGD steps, then measures
memslim.saved_bytes(fn, x, warmup=0), and compares it with the memslim row of the committed
bench/results/suite.json (the figures of bench/results/suite.md). Each model runs in its own
process. Also lists, per model, the rewrites per pass now and then (from the suite row's
note), the predicted bytes, and every `kept` remark whose reason is one of the gate's (an
over-cautious gate shows up there). Writes bench/results/suite_memslim_recheck.md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
RESULTS = os.path.join(HERE, "results")

# The gate's refusal reasons (passes/safety_gate.cpp, SafetyGate::refusal and write_observable).
GATE_REASONS = (
    "an earlier rewrite changed it",
    "in different blocks",
    "inside a loop (not analysed)",
    "matches no registered schema",
    "writes in place or has side effects",
    "in place between its nodes",
    "later writes",
    "covers no node",
)


def worker(model: str, out: str, threads: int) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(threads)
    import memslim
    from _suite_models import SPECS, make_variant
    from _suite_worker import STEADY_STEPS, WARM_STEPS, _sgd, _step

    spec = SPECS[model]
    torch.manual_seed(0)
    x, target = spec.make_inputs(spec.batch)
    if x.is_floating_point():
        x.requires_grad_(True)
    t0 = time.time()
    m = spec.build()
    fn, note = make_variant("memslim", m, x.detach())
    params = list(m.parameters())
    for _ in range(WARM_STEPS + STEADY_STEPS):
        _step(fn, spec, params, x, target)
        _sgd(params)
    res = {
        "model": model,
        "note": note,
        "saved_bytes": memslim.saved_bytes(fn, x, warmup=0),
        "predicted": memslim.predicted_bytes_freed(fn),
        "remarks": memslim.report(fn),
    }
    # The same figure after each of 2 more SGD steps: how much it moves with the data alone
    # (the exact guard-band lists of the output-saving ops are data-dependent).
    later = []
    for _ in range(2):
        _step(fn, spec, params, x, target)
        _sgd(params)
        later.append(memslim.saved_bytes(fn, x, warmup=0))
    res["later_steps"] = later
    res["wall_s"] = round(time.time() - t0, 1)
    with open(out, "w") as f:
        json.dump(res, f)


def counts_of(note: str) -> dict:
    """'scripted; 16 output-saving-activations, 2 x; predicted freed N B' -> {pass: n}."""
    parts = note.split("; ")
    if len(parts) < 3:
        return {}
    return {m.group(2): int(m.group(1)) for m in re.finditer(r"(\d+) ([\w-]+)", parts[1])}


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.out, a.threads)
        return

    import torch
    from _suite_models import FULL_MODELS

    models = [m for m in a.models.split(",") if m] or FULL_MODELS
    ref = {
        r["model"]: r
        for r in json.load(open(os.path.join(RESULTS, "suite.json")))
        if r.get("variant") == "memslim"
    }
    tmp = os.path.join(RESULTS, ".suite_recheck.work")
    os.makedirs(tmp, exist_ok=True)

    with ThreadPoolExecutor(max_workers=a.jobs) as ex:
        rows = list(ex.map(functools.partial(_run_model, a, tmp), models))

    lines = _header_lines(a, torch)
    details = []
    for r in rows:
        line, gate = _row_line(r, ref)
        lines.append(line)
        if gate:
            details.append((r["model"], gate))
    lines.append("")
    if details:
        lines += _gate_section(details)
    path = os.path.join(RESULTS, "suite_memslim_recheck.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    json.dump(rows, open(os.path.join(RESULTS, "suite_memslim_recheck.json"), "w"), indent=0)
    print("\n".join(lines))


def _run_model(a, tmp, model):
    """One model's worker in a subprocess; its row, or one with the error."""
    out = os.path.join(tmp, model + ".json")
    if os.path.exists(out):
        os.unlink(out)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    try:
        p = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                model,
                "--out",
                out,
                "--threads",
                str(a.threads),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=a.timeout,
        )
        rc, tail = p.returncode, (p.stdout + p.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        rc, tail = "timeout", ""
    if os.path.exists(out):
        r = json.load(open(out))
    else:
        r = {
            "model": model,
            "error": f"rc {rc}: {tail.strip().splitlines()[-1:] if tail else ''}",
        }
    print(model, r.get("saved_bytes"), r.get("error", ""), flush=True)
    return r


def _header_lines(a, torch):
    git = subprocess.run(
        ["git", "-C", HERE, "log", "-1", "--format=%h %s"], capture_output=True, text=True
    ).stdout.strip()[:80]
    lines = [
        "# Suite memslim column re-checked after the SafetyGate",
        "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, torch {torch.__version__}, memslim git {git}; "
        f"{a.threads} torch thread(s) per model, {a.jobs} at a time.",
        "",
        f"Command: `python bench/suite_memslim_recheck.py {' '.join(sys.argv[1:])}`",
        "",
        "Same models, sizes, build and SGD steps as bench/suite.py's memslim variant "
        "(make_variant('memslim'), WARM_STEPS + STEADY_STEPS steps, then "
        "memslim.saved_bytes(fn, x, warmup=0)); `suite` = the memslim row of the committed "
        "bench/results/suite.json / suite.md.",
        "",
        "`next 2 steps`: the same measurement after each of 2 more SGD steps (how much the "
        "figure moves with the data alone: the output-saving ops' exact guard-band lists, 8 B "
        "per element near the activation's minimum, are data-dependent). `verdict`: `same` = "
        "same rewrites per pass, same prediction, and the change within that step-to-step range "
        "or below 0.01%.",
        "",
        "| model | suite memslim saved | now | change | next 2 steps | rewrites then | rewrites now | "
        "predicted then | predicted now | kept by a gate rule | verdict |",
        "|---|---:|---:|---:|---|---|---|---:|---:|---:|---|",
    ]
    return lines


def _row_line(r, ref):
    """The table row of one model against the suite's memslim row, and its gate-kept sites."""
    m = r["model"]
    old = ref.get(m, {})
    if "error" in r:
        return (
            f"| {m} | {old.get('saved_bytes', 0):,} | ERROR | | | | | | | | {r['error'][:120]} |",
            [],
        )
    then, now = old.get("saved_bytes"), r["saved_bytes"]
    change = "" if not then else f"{now - then:+,} B ({(now - then) / then:+.2%})"
    pm = re.search(r"predicted freed ([\d,]+) B", old.get("note", ""))
    gate = [ln for ln in r["remarks"] if ": kept " in ln and any(g in ln for g in GATE_REASONS)]
    fmt = lambda d: ", ".join(f"{k} {v}" for k, v in d.items()) or "none"  # noqa: E731
    later = r.get("later_steps", [])
    spread = max([abs(v - now) for v in later] + [0])
    c_then, c_now = counts_of(old.get("note", "")), counts_of(r["note"])
    p_then = int(pm.group(1).replace(",", "")) if pm else None
    if now < then:
        verdict = "better"
    elif (
        c_then == c_now
        and p_then == r["predicted"]
        and (now - then <= spread or now - then <= 1e-4 * then)
    ):
        verdict = "same"
    elif now - then <= spread or now - then <= 1e-4 * then:
        verdict = "same bytes, rewrites differ"
    else:
        verdict = "LOST"
    line = (
        f"| {m} | {then:,} | {now:,} | {change} | {', '.join(f'{v - now:+,}' for v in later)} | "
        f"{fmt(c_then)} | {fmt(c_now)} | {pm.group(1) if pm else ''} | {r['predicted']:,} | "
        f"{len(gate)} | {verdict} |"
    )
    return line, gate


def _gate_section(details):
    lines = ["## Sites kept by a gate rule", ""]
    for m, gate in details:
        lines.append(f"- {m}:")
        for ln in gate[:20]:
            lines.append(f"  - `{ln}`")
        if len(gate) > 20:
            lines.append(f"  - ... {len(gate) - 20} more")
    lines.append("")
    return lines


if __name__ == "__main__":
    main()
