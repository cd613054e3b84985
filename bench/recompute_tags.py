"""Recompute regions under torch.compile: memslim's region op against tagging the region
for Inductor's partitioner (issue 10).

  PYTHONPATH=python .venv/bin/python bench/recompute_tags.py [--batch 8] [--reps 7] [--md F]

The model: resnet18 with its ReLUs replaced by FracAct (memslim._models; the seed-000
hand-written fractional activation, a chain of ~30 pointwise ops with a trainable order),
the suite's resnet18_frac at a smaller batch. Variants, one process, same weights:
- eager;
- torch.compile (Inductor, default partitioner);
- torch.compile with every node Dynamo traced inside a FracAct tagged
  `meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE` (what selective activation
  checkpointing sets): the partitioner must recompute the region in backward;
- memslim.optimize (TorchScript): each FracAct becomes one memslim::recompute_region op
  that keeps the region's inputs and re-runs it in backward;
- memslim.fx.optimize on torch.export's program (the FX front end's region op, eager autograd);
- memslim.compile (the FX front end: its recompute regions applied as MUST_RECOMPUTE tags).
Conv-weight copies: saved tensors shaped like a conv weight that are not the parameter
(Inductor's channels-last copies on the CPU), reported apart from the activations.
Saved bytes: memslim.saved_bytes after the first step. Time: forward+backward against
torch.compile's, interleaved pairs (order alternating), median ratio.

Caches: Inductor's FX graph cache and AOTAutograd's cache are switched off for every
compiled variant. The tags are node metadata, which the cache keys do not cover: with the
caches on, a tagged compile of a model already compiled untagged got the untagged partition
(`--with-caches` shows it).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def build(batch: int):
    from memslim._models import torchvision_with

    return torchvision_with("resnet18", "frac", seed=0).train(), torch.randn(batch, 3, 64, 64)


def tagging_backend(gm, example_inputs):
    """Tags the nodes Dynamo traced inside a FracAct for recomputation, then Inductor."""
    from torch._inductor.compile_fx import compile_fx
    from torch.utils.checkpoint import CheckpointPolicy

    for n in gm.graph.nodes:
        stack = n.meta.get("nn_module_stack") or {}
        if n.op in ("call_function", "call_method") and any(
            "FracAct" in str(t) for _, t in stack.values()
        ):
            n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            n.meta["ac_graph_id"] = 0
    return compile_fx(gm, example_inputs)


def weight_copies(fn, model, x) -> int:
    """Bytes of saved tensors shaped like a 4-d parameter (a conv weight) that are not the
    parameter itself: Inductor's channels-last weight copies on the CPU."""
    from memslim.measure import _storage_key

    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 4}
    params = {_storage_key(p) for p in model.parameters()}
    seen = {}

    def pack(t):
        k = _storage_key(t)
        if k not in params and tuple(t.shape) in shapes:
            seen[k] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    del out
    return sum(seen.values())


def step(fn, x):
    out = fn(x)
    out.float().square().mean().backward()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--md", default="")
    ap.add_argument(
        "--with-caches", action="store_true", help="leave Inductor's and AOTAutograd's caches on"
    )
    a = ap.parse_args()
    import memslim
    from memslim.measure import saved_bytes

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if not a.with_caches:
        torch._inductor.config.fx_graph_cache = False
        torch._functorch.config.enable_autograd_cache = False
    base, x = build(a.batch)
    models = {
        k: copy.deepcopy(base) for k in ("eager", "compile", "tagged", "ts", "export", "memslim")
    }
    fns = {
        "eager": models["eager"],
        "compile": torch.compile(models["compile"]),
        "tagged": torch.compile(models["tagged"], backend=tagging_backend),
        "ts": memslim.optimize(models["ts"], (x,)),
        "export": memslim.fx.optimize(torch.export.export(models["export"], (x,))).module(),
        "memslim": memslim.compile(models["memslim"]),
    }
    names = {
        "eager": "eager",
        "compile": "torch.compile",
        "tagged": "torch.compile, FracAct nodes tagged MUST_RECOMPUTE",
        "ts": "memslim.optimize (TorchScript region op)",
        "export": "memslim.fx.optimize (torch.export, FX region op)",
        "memslim": "memslim.compile (FX: regions as recompute tags)",
    }
    saved, copies = {}, {}
    for k, fn in fns.items():
        step(fn, x)  # compile / warm up
        saved[k] = saved_bytes(fn, x)
        copies[k] = weight_copies(fn, models[k], x)
    ratios = {k: [] for k in fns if k != "compile"}
    for r in range(a.reps):
        for k in ratios:
            pair = ["compile", k] if r % 2 == 0 else [k, "compile"]
            t = {}
            for p in pair:
                t0 = time.perf_counter()
                step(fns[p], x)
                t[p] = time.perf_counter() - t0
            ratios[k].append(t[k] / t["compile"])
    lines = [
        f"# Recompute regions under torch.compile: region op vs recompute tags (batch {a.batch})",
        "",
        f"`PYTHONPATH=python .venv/bin/python bench/recompute_tags.py --batch {a.batch} "
        f"--reps {a.reps}{' --with-caches' if a.with_caches else ''}`, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, caches {'on' if a.with_caches else 'off'}.",
        "",
        "| variant | saved bytes | vs eager | vs torch.compile | step time vs torch.compile "
        "| of which conv-weight copies | activations (the rest) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for k in fns:
        ratio = "1.00x" if k == "compile" else f"{statistics.median(ratios[k]):.2f}x"
        lines.append(
            f"| {names[k]} | {saved[k]:,} | {saved[k] / saved['eager'] - 1:+.1%} | "
            f"{saved[k] / saved['compile'] - 1:+.1%} | {ratio} | {copies[k]:,} | "
            f"{saved[k] - copies[k]:,} |"
        )
    md = "\n".join(lines)
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    sys.exit(main())
