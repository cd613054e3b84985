"""Benchmark suite: memslim against eager, TorchScript, per-block checkpointing and torch.compile
on real models (issue 5). One command:

  .venv/bin/python bench/suite.py            # full run -> bench/results/suite.md, suite_breakdown.md, plots
  .venv/bin/python bench/suite.py --quick    # tiny CNN, batch 2, every variant -> a temp dir (~2 min)

Per (model, variant) a subprocess (_suite_worker.py) measures saved-for-backward bytes, peak RSS
of a few SGD steps, step time as a ratio to an eager copy timed interleaved in the same process,
and the gradients' relative difference to eager's after the same steps. A variant that fails
records its one-line reason. Models, sizes and variants: _suite_models.py; tables: _suite_report.py.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# _suite_models / _suite_report are imported in main(), after --img / --hf-seq are in the
# environment that _suite_models reads its sizes from (the workers read the same variables).

# Saved bytes vs batch size plots: (model, batch sizes, file suffix). The main run's batch comes
# first so that torch.compile's first (static) graph is the one already in inductor's cache; the
# second batch makes it recompile once with a dynamic batch dimension. BERT avoids batch 1,
# which dynamo always specializes (a third compile).
SWEEPS = [("resnet50_gelu", "32,8,16,64", "resnet50_gelu"), ("bert", "4,2,8", "bert")]
SWEEP_VARIANTS = ("eager", "compile", "memslim")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_worker(task, timeout, threads):
    """Runs one worker; returns its JSON row, or a row whose `errors` say why there is none."""
    cmd = [
        sys.executable,
        os.path.join(HERE, "_suite_worker.py"),
        task["model"],
        task["variant"],
        "--batch",
        str(task["batch"]),
        "--out",
        task["json"],
        "--threads",
        str(threads),
    ]
    for opt in ("grads", "sweep"):
        if task.get(opt):
            cmd += ["--" + opt, task[opt]]
    # OMP_NUM_THREADS too: inductor's generated kernels read it when they are compiled.
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    t0 = time.time()
    try:
        with open(task["log"], "w") as log:
            rc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=env
            ).returncode
    except subprocess.TimeoutExpired:
        return {
            "model": task["model"],
            "variant": task["variant"],
            "errors": {"run": f"timed out after {timeout} s"},
        }
    wall = time.time() - t0
    if os.path.exists(task["json"]):
        with open(task["json"]) as f:
            row = json.load(f)
        row["wall_s"] = wall
        return row
    # Killed (out of memory, segfault, abort): the last log line is the best one-line reason.
    with open(task["log"]) as f:
        tail = [ln.strip() for ln in f if ln.strip()]
    return {
        "model": task["model"],
        "variant": task["variant"],
        "wall_s": wall,
        "errors": {"run": f"exit code {rc}: {(tail or ['no output'])[-1][:160]}"},
    }


def run_tasks(tasks, jobs, timeout, threads):
    """Runs the tasks on `jobs` threads, each task in its own worker process, in list order
    except that a task waits for the task its "after" names (eager's gradients, a warm
    inductor cache). Returns {task key: row}."""
    done, results, lock = set(), {}, threading.Condition()
    pending = list(tasks)

    def next_task():
        for t in pending:
            if t.get("after") is None or t["after"] in done:
                pending.remove(t)
                return t
        return None

    def loop():
        while True:
            with lock:
                t = next_task()
                while t is None and pending:
                    lock.wait()
                    t = next_task()
                if t is None:
                    return
            row = run_worker(t, timeout, threads)
            with lock:
                results[t["key"]] = row
                done.add(t["key"])
                lock.notify_all()
            if t.get("on_done"):
                t["on_done"]()
            print(
                f"{'sweep ' if 'sweep' in t else ''}{t['model']:20s} {t['variant']:15s} "
                f"saved {row.get('saved_bytes', row.get('sweep', '-'))!s:>12} "
                f"ratio {row.get('step_ratio', float('nan')):.2f} grad {row.get('grad_rel_last', float('nan')):.1e} "
                f"{row.get('wall_s', 0):.0f}s {row.get('errors', '')}",
                flush=True,
            )

    threads_ = [threading.Thread(target=loop) for _ in range(jobs)]
    for th in threads_:
        th.start()
    for th in threads_:
        th.join()
    return results


def _parse_args():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="tiny CNN, batch 2, every variant, into a temp dir"
    )
    ap.add_argument("--models", default="", help="comma list (default: all of the full run)")
    ap.add_argument("--variants", default="", help="comma list (default: all six)")
    ap.add_argument(
        "--out-dir", default="", help="default: bench/results (full) or a new temp dir (--quick)"
    )
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument(
        "--timeout", type=int, default=0, help="seconds per worker (default 1200, quick 150)"
    )
    # 2 single-threaded workers side by side, not 1 worker with 2 threads: on a machine shared
    # with other jobs, 2 OpenMP threads stall at every barrier while another process holds a
    # core (measured: resnet50-GELU step 0.53 s alone, 7-8 s with one busy neighbour; 1 thread
    # 0.95 s in both cases). Ratios are timed interleaved inside each worker either way.
    ap.add_argument("--jobs", type=int, default=2, help="workers run at once")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument(
        "--img", type=int, default=0, help="image side of the CNNs and ViT (default 64)"
    )
    ap.add_argument(
        "--hf-seq", type=int, default=0, help="sequence length of the transformers (default 64)"
    )
    ap.add_argument(
        "--render-from", default="", help="rewrite the outputs from a finished run's worker dir"
    )
    return ap.parse_args()


def _render_again(a):
    """--render-from: tables and text again, no measuring (the sizes come from the run's env)."""
    with open(os.path.join(a.render_from, "meta.json")) as f:
        meta = json.load(f)
    meta["out_dir"] = a.out_dir or meta["out_dir"]
    os.environ["MEMSLIM_SUITE_IMG"], os.environ["MEMSLIM_SUITE_HF_SEQ"] = (
        str(meta["img"]),
        str(meta["hf_seq"]),
    )
    render(a.render_from, meta)


def _have(pkg):
    return not pkg or importlib.util.find_spec(pkg) is not None


def _model_tasks(models, variants, scratch, SPECS):
    """One worker task per (model, variant); rows for models whose package is missing."""
    rows, tasks = {}, []
    for m in models:
        spec = SPECS[m]
        if not _have(spec.needs):
            for v in variants:
                rows[(m, v)] = {
                    "model": m,
                    "variant": v,
                    "errors": {"run": f"{spec.needs} not installed"},
                }
            continue
        grads = os.path.join(scratch, f"{m}.grads.pt")
        left = {"n": len(variants)}

        def cleanup(grads=grads, left=left):  # eager's gradients: up to ~1 GB for the transformers
            left["n"] -= 1
            if left["n"] == 0 and os.path.exists(grads):
                os.remove(grads)

        for v in variants:
            tasks.append(
                dict(
                    key=(m, v),
                    model=m,
                    variant=v,
                    batch=spec.batch,
                    grads=grads,
                    on_done=cleanup,
                    after=None if v == "eager" else (m, "eager"),
                    json=os.path.join(scratch, f"{m}.{v}.json"),
                    log=os.path.join(scratch, f"{m}.{v}.log"),
                )
            )
    return rows, tasks


def _sweep_tasks(a, out_dir, scratch, tasks, SPECS):
    """Appends the saved-bytes-vs-batch sweeps to tasks; returns (plot notes, sweeps)."""
    # Plots: saved bytes vs batch size, after the model's rows (torch.compile's batch-32 graph is
    # then in inductor's cache). Quick mode sweeps eager and memslim only (no third compile).
    plot_notes, sweeps = [], []
    if not a.no_plots:
        for m, batches, suffix in [("tiny", "2,4,8", "tiny")] if a.quick else SWEEPS:
            path = os.path.join(out_dir, f"saved_vs_batch_{suffix}.png")
            if not _have("matplotlib") or not _have(SPECS[m].needs):
                plot_notes.append(
                    f"{os.path.basename(path)}: skipped (matplotlib or {SPECS[m].needs} not installed)"
                )
                continue
            sweeps.append((m, path))
            for v in ("eager", "memslim") if a.quick else SWEEP_VARIANTS:
                tasks.append(
                    dict(
                        key=("sweep", m, v),
                        model=m,
                        variant=v,
                        batch=SPECS[m].batch,
                        sweep=batches,
                        after=(m, "compile")
                        if (m, "compile") in {t["key"] for t in tasks}
                        else None,
                        json=os.path.join(scratch, f"sweep.{m}.{v}.json"),
                        log=os.path.join(scratch, f"sweep.{m}.{v}.log"),
                    )
                )
    return plot_notes, sweeps


def main():
    a = _parse_args()
    if a.render_from:
        _render_again(a)
        return
    if a.img:
        os.environ["MEMSLIM_SUITE_IMG"] = str(a.img)
    if a.hf_seq:
        os.environ["MEMSLIM_SUITE_HF_SEQ"] = str(a.hf_seq)
    from _suite_models import FULL_MODELS, HF_SEQ, IMG, SPECS, VARIANTS

    models = [m for m in a.models.split(",") if m] or (["tiny"] if a.quick else FULL_MODELS)
    variants = [v for v in a.variants.split(",") if v] or list(VARIANTS)
    for kind, given, known in (("model", models, list(SPECS)), ("variant", variants, VARIANTS)):
        bad = [x for x in given if x not in known]
        if bad:
            sys.exit(f"suite.py: unknown {kind} {bad[0]!r} (known: {', '.join(known)})")
    if "eager" not in variants:
        variants.insert(0, "eager")  # every other row is compared with eager's
    out_dir = a.out_dir or (
        tempfile.mkdtemp(prefix="memslim_suite_") if a.quick else os.path.join(HERE, "results")
    )
    os.makedirs(out_dir, exist_ok=True)
    # Worker JSON, logs and eager's gradients are scratch: a temp dir, not the results dir.
    scratch = tempfile.mkdtemp(prefix="memslim_suite_work_")
    timeout = a.timeout or (150 if a.quick else 1200)
    t_start = time.time()
    load_start = os.getloadavg()
    build = memslim_build()

    rows, tasks = _model_tasks(models, variants, scratch, SPECS)
    plot_notes, sweeps = _sweep_tasks(a, out_dir, scratch, tasks, SPECS)

    results = run_tasks(tasks, a.jobs, timeout, a.threads)
    rows.update({k: r for k, r in results.items() if k[0] != "sweep"})
    meta = dict(
        cmd=".venv/bin/python bench/suite.py" + "".join(" " + s for s in sys.argv[1:]),
        date=f"{datetime.datetime.now():%Y-%m-%d %H:%M}",
        wall_min=(time.time() - t_start) / 60,
        load_start=load_start[0],
        load_end=os.getloadavg()[0],
        jobs=a.jobs,
        threads=a.threads,
        quick=a.quick,
        img=IMG,
        hf_seq=HF_SEQ,
        memslim_build=build,
        models=models,
        variants=variants,
        out_dir=out_dir,
        sweeps=[[m, p] for m, p in sweeps],
        plot_notes=plot_notes,
        skipped={f"{m}|{v}": r for (m, v), r in rows.items() if (m, v) not in results},
    )
    with open(os.path.join(scratch, "meta.json"), "w") as f:
        json.dump(meta, f)
    render(scratch, meta)
    print(
        f"wrote {out_dir}/suite.md in {meta['wall_min']:.1f} min (worker rows and logs: {scratch})",
        flush=True,
    )


def render(scratch, meta):
    """Writes suite.md, suite_breakdown.md, suite.json and the plots from the worker rows in
    `scratch` (<model>.<variant>.json, sweep.<model>.<variant>.json) and the run's `meta`."""
    from _suite_models import SPECS
    from _suite_report import plot_sweep

    rows = {tuple(k.split("|")): r for k, r in meta.get("skipped", {}).items()}
    for m in meta["models"]:
        for v in meta["variants"]:
            path = os.path.join(scratch, f"{m}.{v}.json")
            if os.path.exists(path):
                with open(path) as f:
                    rows[(m, v)] = json.load(f)
            elif (m, v) not in rows:
                log = os.path.join(scratch, f"{m}.{v}.log")
                tail = (
                    [ln.strip() for ln in open(log) if ln.strip()][-1:]
                    if os.path.exists(log)
                    else []
                )
                rows[(m, v)] = {
                    "model": m,
                    "variant": v,
                    "errors": {"run": "no result" + (f": {tail[0][:160]}" if tail else "")},
                }
    plot_notes, sweep_rows = list(meta.get("plot_notes", [])), {}
    for m, path in meta.get("sweeps", []):
        path = os.path.join(meta["out_dir"], os.path.basename(path))
        sw = {}
        for v in SWEEP_VARIANTS:
            p = os.path.join(scratch, f"sweep.{m}.{v}.json")
            if os.path.exists(p):
                with open(p) as f:
                    sw[v] = json.load(f)
        sweep_rows[m] = sw
        shape = SPECS[m].shape
        why = plot_sweep(
            m,
            sw,
            path,
            shape.split("x", 1)[1]
            if "tokens" not in shape
            else "seq " + shape.split("x")[1].split()[0],
        )
        failed = [f"{v}: {r['errors']}" for v, r in sw.items() if r.get("errors")]
        plot_notes.append(
            f"{os.path.basename(path)}: "
            + (why or "written")
            + ("; " + "; ".join(failed) if failed else "")
        )
    write_outputs(meta, rows, sweep_rows, plot_notes)


def memslim_build() -> str:
    """Which memslim was measured: git HEAD (+ whether the tree had changes) and when the
    extension was built (a checkout can be rebuilt while the suite runs)."""
    root = os.path.dirname(HERE)
    try:
        rev = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        rev, dirty = "unknown", ""
    import glob

    libs = glob.glob(os.path.join(root, "python", "memslim", "_C*.so"))
    built = (
        f"{datetime.datetime.utcfromtimestamp(os.path.getmtime(libs[0])):%Y-%m-%d %H:%M} UTC"
        if libs
        else "?"
    )
    return f"git {rev}{' + uncommitted changes' if dirty else ''}, extension built {built}"


def write_outputs(meta, rows, sweep_rows, plot_notes):
    """suite.md (intro, headline, full table, the hooks check, plots), suite_breakdown.md and
    suite.json in meta["out_dir"]."""
    from _suite_report import full_table, headline_table

    out_dir, models, variants = meta["out_dir"], meta["models"], meta["variants"]
    lines = (
        _suite_intro(meta, models)
        + headline_table(rows, models)
        + [
            "",
            "## Full table",
            "",
        ]
        + full_table(rows, models, variants)
        + _hooks_section(rows, models)
    )
    if plot_notes:
        lines += _plots_section(sweep_rows, plot_notes)
    with open(os.path.join(out_dir, "suite.md"), "w") as f:
        f.write("\n".join(lines))
    _write_breakdown(meta, rows, models)
    # Raw rows (without the per-tensor lists) for later inspection.
    with open(os.path.join(out_dir, "suite.json"), "w") as f:
        json.dump(
            [
                {k: v for k, v in r.items() if k not in ("saved_tensors", "saved_by_node")}
                for r in rows.values()
            ],
            f,
            indent=0,
        )


def _suite_intro(meta, models):
    """suite.md from its title to the headline table's heading."""
    from _suite_models import SPECS

    cmd = meta["cmd"]
    try:
        import transformers

        tv = f", transformers {transformers.__version__}"
    except ImportError:
        tv = ""
    sizes = "; ".join(sorted({f"{m}: {SPECS[m].shape}" for m in models}))
    return (
        [
            "# Benchmark suite: memslim against eager, TorchScript, checkpointing and torch.compile",
            "",
            f"{meta['date']}, torch {torch.__version__}{tv}; {cpu_model()}, "
            f"{os.cpu_count()} cores; {meta['jobs']} workers at a time with {meta['threads']} torch thread(s) each; "
            f"fp32 CPU training. Load average at start {meta['load_start']:.1f}, at end {meta['load_end']:.1f} "
            f"(machine shared with other jobs). Whole run: {meta['wall_min']:.1f} min. "
            f"memslim: {meta.get('memslim_build', 'unknown build')}.",
            "",
            f"Command: `{cmd}`",
            "",
        ]
        + ([meta["note"], ""] if meta.get("note") else [])
        + [
            "Sizes: "
            + sizes
            + ". Weights random (seed 0); dropout and stochastic depth set to p=0 "
            "(torchvision: on the modules, transformers: through the configs), so every variant computes "
            "the same function and no RNG has to match across eager, TorchScript and inductor. "
            "Why 1 thread per worker and 2 workers: with 2 OpenMP threads a step stalls whenever another "
            "process holds a core (measured on this machine: resnet50-GELU 0.53 s per step alone, 7-8 s "
            "next to one busy process; 1 thread: 0.95 s either way).",
            "",
            "## Headline",
            "",
            "Saved-for-backward bytes (change vs eager) and step time (forward+backward) as a ratio to eager, "
            "e.g. `x1.20` = 20% slower.",
            "",
        ]
    )


def _hooks_section(rows, models):
    """The columns' legend, then whether saved_tensors_hooks see torch.compile's tensors."""
    from _suite_report import hooks_check_table

    hooks = hooks_check_table(rows, models)
    walked = [ln for ln in hooks[2:] if ln.endswith("| yes |") or ln.endswith("| NO |")]
    compiled = [ln for ln in walked if "torch.compile" in ln]
    n_equal = sum(ln.endswith("| yes |") for ln in compiled)
    n_eager = sum(ln.endswith("| yes |") for ln in walked if ln not in compiled)
    return (
        [
            "",
            "Columns. *saved bytes*: `memslim.saved_bytes` (distinct storages autograd keeps for backward in one "
            "training forward, parameters excluded; buffers such as BN running stats count) after the training "
            "steps, so TorchScript is past its profiling runs. *peak RSS*: `ru_maxrss` of the variant's own "
            "process (import, build, compilation, 3 SGD steps; before the timing phase); inductor's compile "
            "workers are separate processes and not in it. *step RSS growth*: RSS high-water mark of the third "
            "step minus RSS before it, after `malloc_trim` and a reset of the mark (`/proc/self/clear_refs`): "
            "the step's own working set (saved tensors, temporaries, gradients). *first step*: includes "
            "torch.compile's compilation (inductor's on-disk cache may hold kernels from earlier runs, which "
            "shortens it) and TorchScript's profiling run. *step ms / ratio*: medians of 5 forward+backward "
            "steps of the variant and of an eager copy of the model, interleaved in the same process (order "
            "alternating); the eager row's ratio is eager against eager, the noise floor. *grad rel. diff*: max "
            "over parameters and the input (token ids have none) of ||g - g_eager|| / ||g_eager||, at the first "
            "step (same weights: the numerical difference) and after 3 SGD steps (lr 0.01) from the same "
            "initial weights; *max tensor* is the issue's figure, *all* is ||G - G_eager|| / ||G_eager|| over all "
            "tensors concatenated; the worst tensor is named. Tensors whose true gradient is zero make the max "
            "meaningless (rounding noise over rounding noise): BERT's attention key bias (softmax ignores a "
            "per-query constant), a BN bias that feeds only 1x1 convolutions followed by BN (EfficientNet / "
            "MobileNet projections). Other large ones are BatchNorm biases, whose gradient is a "
            "sum over batch and pixels that mostly cancels (resnet50 layer1.2.bn2.bias: norm 1.1, against 94.6 "
            "for the same sum of the terms' magnitudes), so any change in reduction order shows up large "
            "relative to it; and training these randomly initialised nets at this batch is chaotic (docs/measurements.md: a "
            "1e-6 perturbation grows to 100% in four steps), so the after-3-steps column grows from whatever "
            "step 1 differs. The FracAct models' own eager gradients are not finite from the second step (the "
            "order parameter starts at a = 1.16 > 1, so x^(1-a) is singular at 0+; its gradient is ~6e24 and one "
            "SGD step sends it to 1e22): only their step-1 figures compare anything. Rows with 0 differences "
            "run aten's very kernels in the same order. The *notes* "
            "name scripted vs traced (the transformers models do not script: traced with `check_trace=False`), "
            "what memslim rewrote, and failure reasons.",
            "",
            "## Do saved_tensors_hooks see torch.compile's saved tensors?",
            "",
            f"Yes: in {n_equal} of {len(compiled)} torch.compile rows (and {n_eager} of {len(walked) - len(compiled)} "
            "eager rows) the hooks' bytes equal an independent count. "
            "AOTAutograd's compiled function saves its tensors with `ctx.save_for_backward`, which runs the "
            "hooks. The independent count walks the same forward's autograd graph from the output and sums "
            "`ctx.saved_tensors` of the compiled function's node(s) and `_saved_*` of aten nodes (graph "
            "breaks leave some), distinct storages, parameters excluded. Where eager differs, the walk finds "
            "more by 288 to 1,176 B: 0-dim float64 tensors saved by `MulBackward0` (Python scalars such as "
            "FracAct's and GELU-tanh's constants, wrapped as tensors), 8 B each, for which the hooks are not "
            "called; the graph walk is exact there, the hooks miss nothing else. torch.compile's "
            "bytes include channels-last copies of the convolution weights (inductor converts them inside the "
            "graph and the backward keeps the copy; checked on a small CNN): real memory, not parameter storages.",
            "",
        ]
        + hooks
        + [""]
    )


def _plots_section(sweep_rows, plot_notes):
    lines = (
        [
            "## Plots",
            "",
            "Saved bytes vs batch size (same sizes otherwise). torch.compile's point at the main run's batch "
            "is its static graph; the other batches share one recompilation with a dynamic batch dimension "
            "(dynamo's automatic dynamic shapes), whose partition need not save the same tensors, so its "
            "line need not be straight.",
            "",
        ]
        + [f"- {n}" for n in plot_notes]
        + [""]
    )
    for m, sw in sweep_rows.items():
        for v, r in sw.items():
            if r.get("sweep"):
                lines.append(
                    f"- {m} {v}: "
                    + ", ".join(
                        f"batch {b}: {n:,}"
                        for b, n in sorted(r["sweep"].items(), key=lambda kv: int(kv[0]))
                    )
                )
    lines.append("")
    return lines


def _write_breakdown(meta, rows, models):
    from _suite_report import breakdown

    cmd, out_dir = meta["cmd"], meta["out_dir"]
    bd = [
        "# Saved tensors torch.compile avoids that memslim keeps",
        "",
        f"From `{cmd}` ({meta['date']}). For each model where torch.compile (default) saves fewer "
        "bytes than memslim.optimize: the multiset of saved storages, matched across the two processes "
        "by (bytes, dtype) (not by shape: both often save the same data under other shapes, e.g. a "
        "matmul operand transposed), with the shapes each side saved them under and the eager "
        "autograd nodes that save a storage of that size (the likely op)."
        + (" Quick mode lists the tiny model regardless." if meta["quick"] else ""),
        "",
    ] + breakdown(rows, models, force=meta["quick"])
    with open(os.path.join(out_dir, "suite_breakdown.md"), "w") as f:
        f.write("\n".join(bd))
    with open(os.path.join(out_dir, "suite_breakdown.md"), "w") as f:
        f.write("\n".join(bd))


if __name__ == "__main__":
    main()
