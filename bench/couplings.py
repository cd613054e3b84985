"""Reversible models side by side (issue 12): saved-for-backward bytes and step time.

Models (python/memslim/_models.py): RevNet, a RevNet-style CIFAR network of 18 additive
couplings (BN-ReLU-conv in F and G, 3 stages); revnet_affine / revnet_glow, the same network
with affine couplings (RealNVP's x1 * exp(tanh(s)) + t, Glow's (x1 + t) * sigmoid(s + 2),
F and G ending in a 1x1 conv to (s, t)); and RevTransformer, a reversible transformer stack
(attention as F, MLP as G, dropout on). Variants, each a training step (forward,
backward of a sum of squares) on the same weights and input:

  eager       the model as written
  script      torch.jit.script of it (TorchScript's own cost, no memslim)
  memslim     memslim.optimize (invertible-couplings keeps each chain's outputs)
  checkpoint  eager with torch.utils.checkpoint around each coupling (use_reentrant=False):
              what a user does by hand when not writing the inverse
  compile, memslim_compile (with --compile): torch.compile, and memslim.compile (the
              backend splits each chain out and runs it as memslim::coupling_chain, Inductor
              compiles the rest); Inductor's fallback_random is set, so dropout draws as
              eager does and the gradient column compares like with like

Bytes: memslim.saved_bytes (saved_tensors_hooks, distinct storages, parameters excluded).
Time: rounds of one step per variant in rotating order (interleaved); the table gives each
variant's median over rounds divided by eager's median. Gradients: the first step's input
and parameter gradients against eager's (max |diff| / max |eager|).

  .venv/bin/python bench/couplings.py --out bench/results/couplings.md
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
)
import memslim  # noqa: E402
from memslim._models import AdditiveCoupling, AffineCoupling, RevNet, RevTransformer  # noqa: E402

warnings.filterwarnings("ignore", message=".*torch.jit.*deprecated.*")
warnings.filterwarnings("ignore", category=FutureWarning)


class Checkpointed(torch.nn.Module):
    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)


def checkpointed(model: torch.nn.Module) -> torch.nn.Module:
    m = copy.deepcopy(model)
    for name, child in list(m.named_modules()):
        for cname, c in list(child.named_children()):
            if isinstance(c, (AdditiveCoupling, AffineCoupling)):
                setattr(child, cname, Checkpointed(c))
    return m


def build(name: str, batch: int):
    torch.manual_seed(0)
    if name == "revnet":
        return RevNet(), torch.randn(batch, 3, 32, 32)
    if name in ("revnet_affine", "revnet_glow"):
        return RevNet(coupling=name.split("_")[1]), torch.randn(batch, 3, 32, 32)
    return RevTransformer(dim=128, heads=4, depth=6, p=0.1), torch.randn(batch, 64, 256)


def step(model, x):
    torch.manual_seed(1)
    y = model(x)
    y.square().sum().backward()


def grads(model, x):
    for p in model.parameters():
        p.grad = None
    xx = x.clone().requires_grad_()
    step(model, xx)
    return [xx.grad] + [p.grad for p in model.parameters()]


def rel(a, b):
    return max(float((p - q).abs().max() / (q.abs().max() + 1e-30)) for p, q in zip(a, b))


def compiled(kind: str, m):
    return torch.compile(m) if kind == "compile" else memslim.compile(m)


def run(name: str, batch: int, rounds: int, threads: int, with_compile: bool = False):
    torch.set_num_threads(threads)
    model, x = build(name, batch)
    variants = {
        "eager": copy.deepcopy(model),
        "script": torch.jit.script(copy.deepcopy(model)),
        "checkpoint": checkpointed(model),
    }
    base = copy.deepcopy(model)
    variants["memslim"] = memslim.optimize(base, (x,))
    if with_compile:
        torch._inductor.config.fallback_random = True
        for k in ("compile", "memslim_compile"):
            variants[k] = compiled(k, copy.deepcopy(model))
    decisions = [str(d) for d in memslim.report(variants["memslim"]) if "coupling" in str(d)]
    # The drift check runs on a chain's first differentiated call in this process
    # (chains are cached by their functions' text): record its warnings from here on.
    recorder = warnings.catch_warnings(record=True)
    caught = recorder.__enter__()
    warnings.simplefilter("always")
    # Gradients of the first step, each on a fresh copy of the weights.
    fresh = {}
    for k in variants:
        m, _ = build(name, batch)
        if k == "script":
            m = torch.jit.script(m)
        elif k == "checkpoint":
            m = checkpointed(m)
        elif k == "memslim":
            b = m
            m = memslim.optimize(b, (x,))
            fresh[k] = grads(m, x)[:1] + [p.grad for p in b.parameters()]
            continue
        elif k in ("compile", "memslim_compile"):
            m = compiled(k, m)
        fresh[k] = grads(m, x)
    drift = {k: rel(fresh[k], fresh["eager"]) for k in variants}
    for m in variants.values():  # warm-up (profiling executor)
        for _ in range(3):
            step(m, x)
    recorder.__exit__(None, None, None)
    decisions += [
        "drift check: " + str(w.message).split(" (Triggered")[0]
        for w in caught
        if "coupling chain" in str(w.message)
    ]
    # Saved bytes after the warm-up: what every later step keeps (the chain's first
    # differentiated call keeps every block's input to measure drift).
    xr = x.clone().requires_grad_()
    saved = {k: memslim.saved_bytes(m, xr) for k, m in variants.items()}
    times = {k: [] for k in variants}
    order = list(variants)
    for r in range(rounds):
        for k in order[r % len(order) :] + order[: r % len(order)]:
            t0 = time.perf_counter()
            step(variants[k], x)
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    if with_compile:
        decisions += [
            str(d)
            for d in memslim.report(variants["memslim_compile"])
            if d.pass_ == "invertible-couplings"
        ]
    return saved, med, drift, decisions


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="revnet,revtransformer")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--compile", action="store_true", help="add torch.compile and memslim.compile rows"
    )
    a = ap.parse_args()
    lines = [
        "# Reversible models: saved bytes and step time, side by side",
        "",
        "`bench/couplings.py` (git %s), batch %d, %d interleaved rounds, median step time / "
        "eager's. Gradients: first step, max |diff| / max |eager| over the input and every "
        "parameter." % (os.popen("git rev-parse --short HEAD").read().strip(), a.batch, a.rounds),
        "",
        "| model | threads | variant | saved bytes | x eager | step time x eager | grad diff |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    notes = []
    for name in a.models.split(","):
        for t in [int(s) for s in a.threads.split(",")]:
            saved, med, drift, decisions = run(name, a.batch, a.rounds, t, a.compile)
            for k in saved:
                lines.append(
                    "| %s | %d | %s | %d | %.3f | %.2f | %.1e |"
                    % (
                        name,
                        t,
                        k,
                        saved[k],
                        saved[k] / saved["eager"],
                        med[k] / med["eager"],
                        drift[k],
                    )
                )
                print(lines[-1], flush=True)
            notes += ["- %s: %s" % (name, d) for d in decisions if t == 1]
    lines += ["", "memslim's decisions:", ""] + notes
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
