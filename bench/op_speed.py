"""CPU speed of the memslim ops against aten: forward + backward, side by side.

For each activation, x has N fp32 elements drawn from N(0, 1) (the distribution
of pre-activation values after a normalisation layer). One timed step is
forward + backward with grad_out = 1. aten and memslim steps are interleaved
(A B A B ...) so both see the same machine state, and the ratio of medians is
reported. Usage: bench/op_speed.py [--numel N] [--reps R] [--threads T] [--dtype D] [--out FILE]
"""

import argparse
import datetime
import platform
import statistics
import sys
import time

import torch

from memslim import _numerics as N

# The ops and their aten counterparts: memslim._numerics.CASES, one entry per op
# with default arguments (the parameter variants there are for numerics).
OPS = [
    (name, N.CASES[name].aten, N.CASES[name].ours)
    for name in (
        "gelu",
        "gelu_tanh",
        "silu",
        "mish",
        "softplus",
        "elu",
        "celu",
        "selu",
        "leaky_relu",
        "hardswish",
        "hardsigmoid",
        "sigmoid",
        "tanh",
        "relu",
    )
]


def step(fn, x, g):
    t0 = time.perf_counter()
    y = fn(x)
    y.backward(g)
    t1 = time.perf_counter()
    x.grad = None
    return t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--only", default="", help="comma-separated op names")
    ap.add_argument("--out", default="", help="write the markdown table here too")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    ap.add_argument(
        "--split",
        action="store_true",
        help="also time forward and backward apart (ns/element each)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    x = torch.randn(args.numel, dtype=dtype, requires_grad=True)
    g = torch.ones(args.numel, dtype=dtype)
    only = set(filter(None, args.only.split(",")))
    lines = [
        f"CPU forward+backward, {args.numel:,} {args.dtype} N(0,1) elements, median of {args.reps} "
        f"interleaved steps; {datetime.date.today()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}",
        "",
        "| op | aten ms | memslim ms | ratio | aten ns/element | memslim ns/element |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    for name, aten, ours in OPS:
        if only and name not in only:
            continue
        step(aten, x, g), step(ours, x, g)  # warm-up
        ta, tm = [], []
        for _ in range(args.reps):
            ta.append(step(aten, x, g))
            tm.append(step(ours, x, g))
        a, m = statistics.median(ta) * 1e3, statistics.median(tm) * 1e3
        digits = 1 if a >= 10 else 3
        line = (
            f"| {name} | {a:.{digits}f} | {m:.{digits}f} | {m / a:.2f}x | "
            f"{a * 1e6 / args.numel:.2f} | {m * 1e6 / args.numel:.2f} |"
        )
        lines.append(line)
        print(line, flush=True)
    if args.split:
        lines += [
            "",
            "| op | aten fwd ns/el | aten bwd ns/el | memslim fwd ns/el | memslim bwd ns/el |",
            "|---|---:|---:|---:|---:|",
        ]
        print("\n".join(lines[-3:]), flush=True)
        for name, aten, ours in OPS:
            if only and name not in only:
                continue
            parts = []
            for fn in (aten, ours):
                fw, bw = [], []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    y = fn(x)
                    t1 = time.perf_counter()
                    y.backward(g)
                    t2 = time.perf_counter()
                    x.grad = None
                    fw.append(t1 - t0)
                    bw.append(t2 - t1)
                parts += [statistics.median(fw), statistics.median(bw)]
            line = "| %s | %s |" % (
                name,
                " | ".join("%.2f" % (t * 1e9 / args.numel) for t in parts),
            )
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("Command: `.venv/bin/python " + " ".join(sys.argv) + "`\n\n")
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
