"""torch.compile(backend="memslim") against plain torch.compile, side by side (issue 10).

  .venv/bin/python bench/compile_side_by_side.py [--models a,b] [--budget 0.5] [--md F]

Per suite model, in one process per (model, budget): three copies with the same weights, eager,
torch.compile (Inductor) and memslim.compile (memslim's rewrites, then Inductor). Reports
- saved-for-backward bytes (memslim.saved_bytes: distinct storages, parameters excluded) of each;
- step time (forward + backward) of memslim.compile / torch.compile, interleaved in the same
  process (the order alternates per pair), median of the ratios;
- gradients at step 1: global relative L2 distance to eager's of torch.compile and of memslim;
- memslim's decisions (rewrites, predicted bytes).
--budget sets torch._functorch.config.activation_memory_budget for both compiled copies.
--plan: instead, memslim's copy is memslim.compile(model, memory_budget=B) (memslim's
planner, the model's target) and torch.compile's first step (where it partitions) runs under
activation_memory_budget = B (issue 48's side by side: each at its own budget B);
--torch-budget B2 puts torch.compile's at B2 instead (the budget at which torch's keeps
what memslim's plan keeps, where B does not reach it); --ckpt adds a fourth copy,
torch.compile over the model with each block under torch.utils.checkpoint (the suite's
"ckpt" blocks), timed in the same rotation (time_ratio_ckpt: memslim / it).
--dropout P sets every nn.Dropout's p to P (the suite sets 0): the copies then draw different
masks (Inductor's RNG is not eager's), so the gradient columns compare different functions
and only the bytes and times are read.
Models and sizes: _suite_models.py (MEMSLIM_SUITE_IMG / MEMSLIM_SUITE_HF_SEQ as there).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def one(
    model_name: str,
    budget: float,
    reps: int,
    batch: int,
    dropout: float = 0.0,
    plan: bool = False,
    torch_budget: float = 0.0,
    ckpt: bool = False,
) -> dict:
    import torch
    import memslim
    from _suite_models import SPECS, zero_dropout
    from _suite_worker import _grads, _step, grad_diff

    import contextlib

    from torch._functorch import config as functorch_config

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if budget < 1 and not plan:
        functorch_config.activation_memory_budget = budget
    spec = SPECS[model_name]
    torch.manual_seed(0)
    base = zero_dropout(spec.build())
    if dropout > 0:
        for m in base.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = dropout
    x, target = spec.make_inputs(batch or spec.batch)
    if x.is_floating_point():
        x.requires_grad_(True)
    keys = ("eager", "compile", "memslim") + (("ckpt",) if ckpt else ())
    models = {k: copy.deepcopy(base) for k in keys}
    fns = {
        "eager": models["eager"],
        "compile": torch.compile(models["compile"]),
        "memslim": (
            memslim.compile(models["memslim"], memory_budget=budget)
            if plan
            else memslim.compile(models["memslim"])
        ),
    }
    if ckpt:  # torch.compile over the model with each block checkpointed
        from _suite_models import wrap_blocks

        wrap_blocks(models["ckpt"])
        fns["ckpt"] = torch.compile(models["ckpt"])
    params = {k: list(m.parameters()) for k, m in models.items()}
    res = {"model": model_name, "budget": budget, "batch": batch or spec.batch, "dropout": dropout}
    res["plan"] = plan
    res["torch_budget"] = torch_budget or budget
    grads = {}
    for k in keys:
        t = time.perf_counter()
        with (
            functorch_config.patch(activation_memory_budget=torch_budget or budget)
            if plan and k == "compile"
            else contextlib.nullcontext()
        ):
            _step(fns[k], spec, params[k], x, target)
        res[f"first_step_s_{k}"] = time.perf_counter() - t
        grads[k] = _grads(params[k], x)
    for k in keys[1:]:
        res[f"grad_glob_{k}"] = grad_diff(grads[k], grads["eager"])[2]
    del grads
    for k in keys:
        res[f"saved_{k}"] = memslim.saved_bytes(fns[k], x, warmup=1)
    ratios, ckpt_ratios = [], []
    timed = keys[1:]
    for r in range(reps):
        order = timed[r % len(timed) :] + timed[: r % len(timed)]  # rotated each round
        t = {}
        for k in order:
            t0 = time.perf_counter()
            _step(fns[k], spec, params[k], x, target)
            t[k] = time.perf_counter() - t0
        ratios.append(t["memslim"] / t["compile"])
        if ckpt:
            ckpt_ratios.append(t["memslim"] / t["ckpt"])
    if ckpt:
        res["time_ratio_ckpt"] = statistics.median(ckpt_ratios)
    res["time_ratio"] = statistics.median(ratios)
    decisions = memslim.report(fns["memslim"])
    res["rewrites"] = sum(d.verdict == "rewrote" for d in decisions)
    # The plan each graph took (its memory-budget note that starts with the target).
    res["plans"] = [
        d.text
        for d in decisions
        if d.pass_ == "memory-budget" and d.text.startswith(("budget", "the graph's share"))
    ]
    # Rewrites in graphs Inductor got rewritten (the backend's inductor-partition note
    # follows each graph's records and says whether its rewrites were kept).
    compiled = pending = 0
    for d in decisions:
        if d.pass_ == "inductor-partition":
            compiled += pending if "rewrites kept" in d else 0
            pending = 0
        elif d.verdict == "rewrote":
            pending += 1
    res["rewrites_compiled"] = compiled + pending
    res["sites"] = sum(d.verdict in ("rewrote", "kept") for d in decisions)
    res["predicted"] = memslim.predicted_bytes_freed(fns["memslim"])
    return res


def table(rows) -> str:
    out = [
        "| model | budget | eager | torch.compile | memslim.compile | vs compile | time vs "
        "compile | grads compile | grads memslim | rewrites compiled / decided / sites |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            out.append(
                f"| {r['model']} | {r['budget']} | error: {r['error'][:120]} | | | | | | | |"
            )
            continue
        mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
        rel = r["saved_memslim"] / r["saved_compile"] - 1
        out.append(
            f"| {r['model']} | {r['budget']} | {mib(r['saved_eager'])} | "
            f"{mib(r['saved_compile'])} | {mib(r['saved_memslim'])} | {rel:+.1%} | "
            f"{r['time_ratio']:.3f}x | {r['grad_glob_compile']:.1e} | "
            f"{r['grad_glob_memslim']:.1e} | {r.get('rewrites_compiled', '?')} / "
            f"{r['rewrites']} / {r['sites']} |"
        )
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="")
    ap.add_argument("--budget", default="1.0", help="comma list, e.g. 1.0,0.5")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=0, help="0: the suite's batch")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--md", default="")
    ap.add_argument("--dropout", type=float, default=0.0, help="nn.Dropout p (suite: 0)")
    ap.add_argument("--plan", action="store_true", help="memslim.compile(memory_budget=B)")
    ap.add_argument("--torch-budget", type=float, default=0.0, help="with --plan: torch's B")
    ap.add_argument("--ckpt", action="store_true", help="also torch.compile, blocks checkpointed")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        res = one(
            a.one[0], float(a.one[1]), a.reps, a.batch, a.dropout, a.plan, a.torch_budget, a.ckpt
        )
        print("RESULT " + json.dumps(res))
        return
    from _suite_models import FULL_MODELS

    models = a.models.split(",") if a.models else FULL_MODELS
    rows = []
    for budget in a.budget.split(","):
        for m in models:
            cmd = [
                sys.executable,
                __file__,
                "--one",
                m,
                budget,
                "--reps",
                str(a.reps),
                "--batch",
                str(a.batch),
                "--dropout",
                str(a.dropout),
            ] + (["--plan", "--torch-budget", str(a.torch_budget)] if a.plan else [])
            cmd += ["--ckpt"] if a.ckpt else []
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
                if line:
                    row = json.loads(line[-1][7:])
                else:
                    tail = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
                    row = {
                        "model": m,
                        "budget": float(budget),
                        "error": (tail or ["no output"])[-1],
                    }
            except subprocess.TimeoutExpired:
                row = {"model": m, "budget": float(budget), "error": f"timed out ({a.timeout} s)"}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if a.jsonl:
                with open(a.jsonl, "a") as f:
                    f.write(json.dumps(row) + "\n")
    md = table(rows)
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
