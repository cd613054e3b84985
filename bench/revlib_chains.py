"""revlib's ReversibleSequential (issue 45) through memslim.compile, against revlib's own
default mode and plain torch.compile, for conv blocks and for linear blocks.

revlib 1.7.2's ReversibleModule.forward calls torch.get_rng_state() in every block, which
Dynamo breaks the graph at (and, inside ReversibleSequential's loop, gives up the loop's
frame), so no compiled graph holds two couplings. memslim.compile traces the read as
memslim::rng_state (memslim.rng_reads); this script shows the graph count with and without
that, and what the chain then keeps.

Ways (the same weights; memory_mode no_savings gives the plain network):
- eager: no_savings, eager;
- revlib: memory_mode autograd_function (revlib's default), eager;
- torch.compile: no_savings, torch.compile (Inductor);
- memslim.compile: no_savings, memslim.compile(dynamic=False).
Measures: saved = memslim.saved_bytes (what saved-tensor hooks see: revlib's default mode
keeps its blocks' tensors on ctx, where hooks do not see them), alive = bytes of the
storages the forward made still alive after it (bench/memcnn_revnet.alive_bytes: counts
ctx's too; eager ways only: a dispatch mode around a compiled call changes what it runs),
peak = a training step's (forward, loss, backward) highest live CPU tensor bytes from the
profiler's memory events (memslim.probe.step_peak_bytes), parameters, gradients and input
outside it counted once they exist; time = each round's step time over torch.compile's in that
round (every way once per round, in turn: interleaved), median and quartiles; gradients: max |a - b| / max |b|
over the input and every parameter against eager fp32 (torch.compile's own drift beside).
Usage: bench/revlib_chains.py [--rounds 15] [--out FILE] (needs `pip install revlib==1.7.2`).
"""

import argparse
import copy
import datetime
import os
import re
import statistics
import subprocess
import sys
import time
import warnings

import torch

import memslim
from memslim.probe import step_peak_bytes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memcnn_revnet import alive_bytes  # noqa: E402

warnings.filterwarnings("ignore")


def conv_fn(c):
    return torch.nn.Sequential(
        torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(c, c, 3, padding=1)
    )


def linear_fn(d):
    return torch.nn.Sequential(
        torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
    )


class Net(torch.nn.Module):
    """A stem, revlib's ReversibleSequential of `depth` functions (depth / 2 couplings),
    a head."""

    def __init__(self, kind, mode, depth=8, width=32):
        import revlib

        super().__init__()
        torch.manual_seed(0)
        fn = conv_fn if kind == "conv" else linear_fn
        if kind == "conv":
            self.stem = torch.nn.Conv2d(3, 2 * width, 3, padding=1)
            self.head = torch.nn.Linear(2 * width, 10)
            dim = 1
        else:
            self.stem = torch.nn.Linear(2 * width, 2 * width)
            self.head = torch.nn.Linear(2 * width, 10)
            dim = -1
        self.kind = kind
        self.rev = revlib.ReversibleSequential(
            *[fn(width) for _ in range(depth)], split_dim=dim, memory_mode=mode
        )

    def forward(self, x):
        h = self.rev(self.stem(x))
        h = h.mean((2, 3)) if self.kind == "conv" else h.mean(1)
        return self.head(h)


def inputs(kind, batch):
    torch.manual_seed(1)
    if kind == "conv":
        return torch.randn(batch, 3, 32, 32)
    return torch.randn(batch, 128, 64)


def grads(model, params, x):
    xx = x.clone().requires_grad_()
    model(xx).square().sum().backward()
    out = [xx.grad] + [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out


def train_step(model, base, x):
    """One training step of `model` on a fresh copy of `x` (`base`: the module whose
    parameters it trains; their gradients dropped after)."""
    model(x.clone().requires_grad_()).square().sum().backward()
    for p in base.parameters():
        p.grad = None


def time_ratios(ws, x, rounds, base_way):
    """Each way's step time over `base_way`'s ((name, model, base) ways, each once per
    round in turn: interleaved), per round, then their median and quartiles:
    ({way: (median, q1, q3)}, base_way's median step in seconds)."""
    times = {name: [] for name, _, _ in ws}
    for _ in range(rounds):
        for name, model, base in ws:
            t0 = time.perf_counter()
            train_step(model, base, x)
            times[name].append(time.perf_counter() - t0)
    base_t = times[base_way]
    out = {}
    for name, ts in times.items():
        ratios = sorted(t / b for t, b in zip(ts, base_t))
        q = statistics.quantiles(ratios, n=4)
        out[name] = (statistics.median(ratios), q[0], q[2])
    return out, statistics.median(base_t)


def max_rel(a, b):
    return max(float((p - q).abs().max() / q.abs().max()) for p, q in zip(a, b))


def graph_count(model, x):
    torch._dynamo.reset()
    return torch._dynamo.explain(model)(x).graph_count


def ways(kind):
    import revlib

    plain = revlib.MemoryModes.no_savings
    eager = Net(kind, plain)
    rev = Net(kind, revlib.MemoryModes.autograd_function)
    rev.load_state_dict(eager.state_dict())
    tc_base = copy.deepcopy(eager)
    ms_base = copy.deepcopy(eager)
    return [
        ("eager (no_savings)", eager, eager),
        ("revlib (autograd_function)", rev, rev),
        ("torch.compile (no_savings)", torch.compile(tc_base, dynamic=False), tc_base),
        ("memslim.compile (no_savings)", memslim.compile(ms_base, dynamic=False), ms_base),
    ]


def chains(compiled):
    """The couplings of each chain memslim.compile made, e.g. [4]."""
    rs = [str(d) for d in memslim.report(compiled) if d.pass_ == "invertible-couplings"]
    return [int(m.group(1)) for r in rs if (m := re.search(r"(\d+) \w+ couplings? -> ", r))]


def measure(kind, batch, rounds):
    import revlib

    x = inputs(kind, batch)
    rows = []
    torch._dynamo.reset()
    ws = ways(kind)
    ref = grads(ws[0][1], list(ws[0][2].parameters()), x)
    for name, model, base in ws:
        g = grads(model, list(base.parameters()), x)  # also compiles
        g = grads(model, list(base.parameters()), x)
        xr = x.clone().requires_grad_()
        saved = memslim.saved_bytes(model, xr)
        # A dispatch mode around a compiled call changes what it runs: eager ways only.
        alive = alive_bytes(model, xr) if model is base else None

        peak = step_peak_bytes(lambda model=model, base=base: train_step(model, base, x))
        rows.append(dict(way=name, saved=saved, alive=alive, peak=peak, grad=max_rel(g, ref)))
    ratios, tc = time_ratios(ws, x, rounds, "torch.compile (no_savings)")
    for r in rows:
        r["time"] = ratios[r["way"]]
    chain = chains(ws[3][1])
    plain = Net(kind, revlib.MemoryModes.no_savings)
    before = graph_count(plain, x)
    with memslim.rng_reads.in_graph():
        after = graph_count(plain, x)
    torch._dynamo.reset()
    return rows, chain, (before, after), tc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch-conv", type=int, default=8)
    ap.add_argument("--batch-linear", type=int, default=16)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"# revlib's ReversibleSequential through memslim.compile ({datetime.date.today()})",
        "",
        f"commit {commit}, torch {torch.__version__}, threads {torch.get_num_threads()}, CPU, "
        f"fp32; `bench/revlib_chains.py --rounds {a.rounds}`. Method: this script's docstring.",
        "",
    ]
    for kind, batch in (("conv", a.batch_conv), ("linear", a.batch_linear)):
        rows, chain, (before, after), tc = measure(kind, batch, a.rounds)
        shape = (
            "3x32x32, 8 functions of conv3x3-ReLU-conv3x3 on 32 channels"
            if kind == "conv"
            else ("128 tokens x 64, 8 functions of linear(32, 128)-GELU-linear(128, 32)")
        )
        lines += [
            f"## {kind} blocks (batch {batch}, {shape}: 4 couplings)",
            "",
            f"Dynamo graphs of the no_savings net: {before} as torch ships it, {after} with "
            f"torch.get_rng_state traced (memslim.rng_reads). memslim.compile's chains: "
            f"{', '.join(f'one of {k} couplings' for k in chain) or 'none'}. torch.compile's "
            f"step: {tc * 1e3:.1f} ms (median of {a.rounds}).",
            "",
            "| way | saved B | alive B | step peak B | step time / torch.compile "
            "(median [quartiles]) | grad vs eager |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['way']} | {r['saved']:,} | "
                f"{'n/a' if r['alive'] is None else format(r['alive'], ',')} | {r['peak']:,} | "
                f"{r['time'][0]:.2f} [{r['time'][1]:.2f}, {r['time'][2]:.2f}] | {r['grad']:.1e} |"
            )
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
