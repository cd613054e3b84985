"""Would a coupling chain's F and G run faster compiled by Inductor than through the
TorchScript interpreter's eager kernels (issue 45)? Measured on one function, as the
chain runs it: its forward without grad (the chain's forward and the rebuild), and its
forward with grad then the vector-Jacobian product for one cotangent (the chain's
backward re-run), eager aten against Inductor (compile_fx on make_fx's aten graph of the
same function: an inference graph for the forward, a joint one for the re-run).

Functions: revlib_chains.py's (linear(32, 128)-GELU-linear(128, 32) on 16 x 128 tokens;
conv3x3-ReLU-conv3x3 on 32 channels at 8 x 32 x 32) and memcnn's (conv3x3-BN-ReLU on a
RevNet-38 stage-1 half, 16 channels at 8 x 32 x 32, BatchNorm in eval form: a replay
writes no running stats here). Times: median of interleaved rounds, per thread count.
Usage: bench/chain_fn_inductor.py [--rounds 40] [--out FILE]
"""

import argparse
import datetime
import statistics
import subprocess
import time
import warnings

import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore")


def linear_fn(x, w1, b1, w2, b2):
    return (F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2),)


def conv_fn(x, w1, b1, w2, b2):
    return (F.conv2d(F.relu(F.conv2d(x, w1, b1, padding=1)), w2, b2, padding=1),)


def bn_fn(x, w, g, b, rm, rv):
    return (F.relu(F.batch_norm(F.conv2d(x, w, padding=1), rm, rv, g, b, False)),)


def cases():
    torch.manual_seed(0)
    d = 32
    yield (
        "linear(32,128)-GELU-linear(128,32), 16x128 tokens",
        linear_fn,
        [torch.randn(16, 128, d), torch.randn(4 * d, d), torch.randn(4 * d)]
        + [torch.randn(d, 4 * d), torch.randn(d)],
        5,
    )
    yield (
        "conv3x3-ReLU-conv3x3, 32 ch, 8x32x32",
        conv_fn,
        [torch.randn(8, 32, 32, 32), torch.randn(32, 32, 3, 3), torch.randn(32)]
        + [torch.randn(32, 32, 3, 3), torch.randn(32)],
        5,
    )
    yield (
        "conv3x3-BN(eval)-ReLU, 16 ch, 8x32x32",
        bn_fn,
        [torch.randn(8, 16, 32, 32), torch.randn(16, 16, 3, 3), torch.randn(16)]
        + [torch.randn(16), torch.randn(16), torch.rand(16) + 0.5],
        4,
    )


def measure(fn, args, n_grad, rounds):
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    plain = [a.detach() for a in args]
    train = [a.detach().requires_grad_(i < n_grad) for i, a in enumerate(args)]
    inference = compile_fx(make_fx(fn)(*plain), plain)
    joint = compile_fx(make_fx(fn)(*train), train)
    cot = torch.randn_like(fn(*plain)[0])
    wrt = train[:n_grad]

    def eager_fwd():
        with torch.no_grad():
            fn(*plain)

    def inductor_fwd():
        with torch.no_grad():
            inference(*plain)

    def eager_vjp():
        torch.autograd.grad(fn(*train)[0], wrt, cot)

    def inductor_vjp():
        torch.autograd.grad(joint(*train)[0], wrt, cot)

    ways = [eager_fwd, inductor_fwd, eager_vjp, inductor_vjp]
    for w in ways:
        w()
        w()
    times = {w.__name__: [] for w in ways}
    for _ in range(rounds):
        for w in ways:
            t0 = time.perf_counter()
            w()
            times[w.__name__].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"# A chain's F / G: eager kernels against Inductor ({datetime.date.today()})",
        "",
        f"commit {commit}, torch {torch.__version__}, CPU, fp32; "
        f"`bench/chain_fn_inductor.py --rounds {a.rounds}`. Method: this script's docstring.",
        "",
        "| function | threads | forward eager ms | Inductor | ratio | forward + vjp eager ms "
        "| Inductor | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name, fn, args, n_grad in cases():
            t = measure(fn, args, n_grad, a.rounds)
            lines.append(
                f"| {name} | {threads} | {t['eager_fwd'] * 1e3:.3f} | "
                f"{t['inductor_fwd'] * 1e3:.3f} | {t['inductor_fwd'] / t['eager_fwd']:.2f} | "
                f"{t['eager_vjp'] * 1e3:.3f} | {t['inductor_vjp'] * 1e3:.3f} | "
                f"{t['inductor_vjp'] / t['eager_vjp']:.2f} |"
            )
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
