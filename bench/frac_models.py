"""Seed-000-style trainable activation (memslim._models.FracAct) in place of ReLU
(ResNets) or SiLU (EfficientNet), 128x3x32x32 fp32 (issue 4's setting).

Per model: saved-for-backward bytes of eager ReLU/SiLU, eager GELU, eager FracAct,
scripted FracAct and memslim.optimize(FracAct model); step time (forward+backward,
CPU) of memslim and of the scripted model as ratios to the unmodified eager model,
measured side by side (interleaved, median of --reps); and the largest relative
gradient difference (loss, input, every parameter including the trainable orders)
against eager over 5 SGD steps (same RNG seed for both models' forward; models
re-synchronised before each step, as in
test/python/test_optimize.py::assert_same_training).
Usage: bench/frac_models.py [--batch 128] [--reps 5] [--threads 1] [--models a,b] [--out FILE]"""

import argparse
import os
import datetime
import platform
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import memslim
from memslim._models import torchvision_with

warnings.filterwarnings("ignore", message=r".*torch\.jit\.(script|save|load).*deprecated")
MiB = 2**20


def step_time(model, x):
    t = time.perf_counter()
    model(x).sum().backward()
    return time.perf_counter() - t


class Interpreted(torch.nn.Module):
    """`inner` with the region op's fused CPU loop switched off (MEMSLIM_REGION_KERNEL=0,
    read per call): the TorchScript interpreter path, bit for bit eager's."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        old = os.environ.get("MEMSLIM_REGION_KERNEL")
        os.environ["MEMSLIM_REGION_KERNEL"] = "0"
        try:
            return self.inner(x)
        finally:
            if old is None:
                del os.environ["MEMSLIM_REGION_KERNEL"]
            else:
                os.environ["MEMSLIM_REGION_KERNEL"] = old


def max_grad_diff(ref, ours, batch, steps=5):
    """Largest relative L2 difference of loss, input grad and parameter grads, over the
    steps whose eager gradients are finite (FracAct's shared order gets a gradient summed
    over every element, and x^(-a) is singular at 0+: plain SGD can blow up within a few
    steps, in eager alone); on the other steps, whether ours is bit-identical to eager, inf
    and NaN positions included. Returns (difference, finite steps, identical steps)."""
    opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    torch.manual_seed(1)
    worst, compared, identical = 0.0, 0, 0
    base = getattr(ours, "inner", ours)  # Interpreted wraps the optimized module
    for step in range(steps):
        with torch.no_grad():
            mine = base.state_dict()
            for k, t in ref.state_dict().items():
                mine[k].copy_(t)
        x = torch.randn(batch, 3, 32, 32)
        res = []
        for m, params_of in ((ref, ref), (ours, base)):
            m.zero_grad()
            # Same dropout / stochastic-depth draws for both (EfficientNet has both;
            # the region op draws no random numbers).
            torch.manual_seed(100 + step)
            xi = x.clone().requires_grad_(True)
            out = m(xi)
            loss = F.cross_entropy(out, torch.arange(batch) % out.shape[-1])
            loss.backward()
            g = dict((n, p.grad) for n, p in params_of.named_parameters())
            res.append(
                [loss.detach().reshape(1), xi.grad] + [g[n] for n, _ in ref.named_parameters()]
            )
        identical += all(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(*res))
        opt.step()
        if not all(bool(torch.isfinite(t).all()) for t in res[0]):
            continue
        compared += 1
        for a, b in zip(*res):
            worst = max(worst, float((a - b).norm().double() / (a.norm().double() + 1e-30)))
    return worst, compared, identical


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--models", default="resnet18,resnet50,efficientnet_b0")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: a busy neighbour on this 2-core machine moved 2-thread "
        "step times by 2-5x; 1-thread ratios stayed put)",
    )
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x = torch.randn(a.batch, 3, 32, 32)
    lines = [
        f"FracAct models, {a.batch}x3x32x32 fp32, CPU ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads); {datetime.date.today()}, torch {torch.__version__}",
        "",
        "Saved-for-backward bytes (MiB; distinct storages, parameters excluded):",
        "",
        "| model | eager ReLU/SiLU | eager GELU | eager FracAct | scripted FracAct | memslim FracAct | memslim / eager GELU |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    times = [
        "",
        f"Step time (forward+backward), ratio to the unmodified eager FracAct model, interleaved, median of {a.reps}:",
        "",
        "| model | eager (s) | memslim | memslim, interpreter | scripted | loss, input and parameter gradients vs eager (5 SGD steps): interpreter / fused loop |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for arch in a.models.split(","):
        base = "silu" if arch.startswith("efficientnet") else "relu"
        eager = {
            act: memslim.saved_bytes(torchvision_with(arch, act), x, warmup=0)
            for act in (base, "gelu", "frac")
        }
        ref = torchvision_with(arch, "frac")
        scripted = torch.jit.script(torchvision_with(arch, "frac"))
        ours = memslim.optimize(torchvision_with(arch, "frac"), (x,))
        s_scripted, s_ours = memslim.saved_bytes(scripted, x), memslim.saved_bytes(ours, x)
        lines.append(
            f"| {arch} | {eager[base] / MiB:.1f} | {eager['gelu'] / MiB:.1f} | {eager['frac'] / MiB:.1f} | "
            f"{s_scripted / MiB:.1f} | {s_ours / MiB:.1f} | {s_ours / eager['gelu']:.4f}x |"
        )
        print(lines[-1], flush=True)
        models = (ref, ours, Interpreted(ours), scripted)
        for m in models:  # warm-up: the scripted executors profile their first calls
            step_time(m, x), step_time(m, x)
        t = [[] for _ in models]
        for _ in range(a.reps):
            for k, m in enumerate(models):
                t[k].append(step_time(m, x))
        med = [statistics.median(v) for v in t]
        grads = []
        for m in (Interpreted(ours), ours):
            diff, compared, identical = max_grad_diff(torchvision_with(arch, "frac"), m, a.batch)
            grads.append(
                f"{diff:.1e} over {compared} finite steps, bit-identical in {identical} of 5"
            )
        times.append(
            f"| {arch} | {med[0]:.2f} | {med[1] / med[0]:.2f}x | {med[2] / med[0]:.2f}x | "
            f"{med[3] / med[0]:.2f}x | {grads[0]} / {grads[1]} |"
        )
        print(times[-1], flush=True)
    text = "\n".join(lines + times) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write("Command: `.venv/bin/python " + " ".join(sys.argv) + "`\n\n" + text)
    print(text)


if __name__ == "__main__":
    main()
