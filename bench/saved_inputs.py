"""Convolution weights saved as they are: what Inductor's channels-last copies of saved
inputs cost, and what memslim's guard (inductor_guards.keep_inputs_as_they_are) gives back.

  .venv/bin/python bench/saved_inputs.py [--reps 5] [--out bench/results/saved_inputs_DATE.md]

Under layout optimisation (always on the CPU with mkldnn; on GPUs by a heuristic over the
convolutions) Inductor gives each forward output that feeds a convolution channels-last
strides. A forward output that is the graph's own input, a convolution's weight or input
AOTAutograd saves for backward, then becomes a channels-last copy kept until backward. Per
model (torchvision, built from code, train mode, fp32, CPU) three ways: plain torch.compile,
torch.compile with only memslim's Inductor guards (the copy avoided, nothing else
changed), and backend="memslim". Saved: memslim.saved_bytes (saved_tensors_hooks, distinct
storages, parameters excluded). Peak: probe.step_peak_bytes over one forward + backward
(live tensor bytes from the step's start; the parameters and input are not in it). Step:
the median of interleaved rounds of forward + backward, as a ratio to plain
torch.compile's. Gradients: max relative difference to eager over the parameters.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import memslim  # noqa: E402
from memslim import inductor_guards  # noqa: E402
from memslim.probe import step_peak_bytes  # noqa: E402


def _gelu(m: nn.Module) -> nn.Module:
    for n, c in m.named_children():
        if isinstance(c, nn.ReLU):
            setattr(m, n, nn.GELU())
        else:
            _gelu(c)
    return m


MODELS = {
    "resnet18_gelu 8x3x32x32": (
        lambda: _gelu(torchvision.models.resnet18(num_classes=10)),
        (8, 3, 32, 32),
    ),
    "resnet18 32x3x64x64": (lambda: torchvision.models.resnet18(num_classes=10), (32, 3, 64, 64)),
    "resnet50 8x3x64x64": (lambda: torchvision.models.resnet50(num_classes=10), (8, 3, 64, 64)),
}


def _guards_only(gm, example_inputs):
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=inductor_guards.config_patches())


WAYS = {
    "torch.compile": lambda m: torch.compile(m),
    "torch.compile + memslim's Inductor guards": lambda m: torch.compile(m, backend=_guards_only),
    'backend="memslim"': lambda m: torch.compile(m, backend="memslim"),
}


def _step(model, x):
    model(x).square().mean().backward()


def run(name, reps):
    build, shape = MODELS[name]
    torch.manual_seed(0)
    x = torch.randn(*shape)
    torch.manual_seed(0)
    eager = build()
    ref = torch.autograd.grad(eager(x).square().mean(), list(eager.parameters()))
    rows, fns = [], {}
    for way, wrap in WAYS.items():
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = build()
        c = wrap(m)
        t = time.perf_counter()
        saved = memslim.saved_bytes(c, x)
        first = time.perf_counter() - t
        grads = torch.autograd.grad(c(x).square().mean(), list(m.parameters()))
        diff = max(
            ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
            for g, r in zip(grads, ref)
        )
        m.zero_grad(set_to_none=True)
        peak = step_peak_bytes(lambda c=c: _step(c, x))
        m.zero_grad(set_to_none=True)
        fns[way] = (c, m)
        rows.append({"way": way, "saved": saved, "peak": peak, "diff": diff, "first": first})
    times = {w: [] for w in fns}
    for _ in range(reps):  # interleaved rounds
        for w, (c, m) in fns.items():
            t = time.perf_counter()
            _step(c, x)
            times[w].append(time.perf_counter() - t)
            m.zero_grad(set_to_none=True)
    base = statistics.median(times["torch.compile"])
    for r in rows:
        r["step"] = statistics.median(times[r["way"]]) / base
        r["base_s"] = base
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    day = datetime.date.today().isoformat()
    lines = [
        f"# Convolution weights saved as they are ({day}, commit {commit}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, CPU, fp32)",
        "",
        "Written by `bench/saved_inputs.py` (method in its docstring). Saved and peak in MiB; step: the median of "
        f"{a.reps} interleaved rounds as a ratio to plain torch.compile's; grad: max relative difference to eager.",
        "",
        "| model | way | saved MiB | peak MiB | step vs torch.compile | first step s | grad diff |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in a.models.split(","):
        for r in run(name, a.reps):
            lines.append(
                f"| {name} | {r['way']} | {r['saved'] / 2**20:.2f} | {r['peak'] / 2**20:.2f} | "
                f"{r['step']:.2f}x ({r['base_s']:.2f} s) | {r['first']:.0f} | {r['diff']:.1e} |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
