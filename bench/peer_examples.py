"""The example networks of revtorch 0.2.4 and invtorch 0.5.0 (issue 45), as their READMEs
ship them, against memslim on the plain network.

revtorch's README trains a PartiallyReversibleNet on CIFAR-10 (batch 4): conv 3 -> 32, a
ReversibleSequence of 4 ReversibleBlocks (F and G each ReLU then conv3x3 on 16 channels,
split on channels), ReLU, conv 32 -> 10, global average pool. revtorch has no switch that
turns its wrapper off, so the plain network is the same modules run as revtorch's
ReversibleBlock.forward runs them, with grad: x1, x2 = chunk(x, 2, 1); y1 = x1 + F(x2);
y2 = x2 + G(y1); x = cat([y1, y2], 1) (what a user writes who leaves the memory to
memslim).

invtorch's README example is one InvertibleLinear (3 -> 5, inverse by pinverse) on 10 rows;
its package's networks are stacks of such layers (invtorch.nn.Linear: an orthogonal
parametrisation, inverse by torch.inverse). The second row here is that README layer at a
size where memory shows (1,024 rows, 256 -> 256, four of them in invtorch.nn.Sequential).

Ways (the same weights): eager (plain network), the peer's own (its wrapper), torch.compile
(plain), memslim.compile (plain), memslim.optimize (plain, scripted or traced).
Measures, as bench/revlib_chains.py's: saved = memslim.saved_bytes (saved-tensor hooks;
the peers keep their tensors on ctx, which hooks do not see), alive = bytes of the
storages the forward made still alive after it (eager ways only), step peak (profiler
memory events: probe.step_peak_bytes), step time over torch.compile's, interleaved rounds,
median and quartiles, gradients max |a - b| / max |b| over input and parameters against
eager fp32 and eager fp64 (invtorch's own way: the input's only; its parameters are its
parametrisation's originals).
Usage: bench/peer_examples.py [--rounds 9] [--out FILE] (needs `pip install --no-deps
revtorch==0.2.4 invtorch==0.5.0`).
"""

import argparse
import copy
import datetime
import os
import subprocess
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import memslim
from memslim.probe import step_peak_bytes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memcnn_revnet import alive_bytes  # noqa: E402
from revlib_chains import chains, grads, max_rel, time_ratios, train_step  # noqa: E402

warnings.filterwarnings("ignore")


class PartiallyReversibleNet(nn.Module):
    """revtorch 0.2.4's README network; `plain`: its blocks run without revtorch's
    ReversibleSequence (see the module docstring)."""

    def __init__(self, plain: bool):
        import revtorch as rv

        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 32, 3)
        blocks = []
        for _ in range(4):
            f_func = nn.Sequential(nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))
            g_func = nn.Sequential(nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))
            blocks.append(rv.ReversibleBlock(f_func, g_func))
        self.blocks = nn.ModuleList(blocks)
        self.sequence = None if plain else rv.ReversibleSequence(self.blocks)
        self.conv2 = nn.Conv2d(32, 10, 3)

    def forward(self, x):
        x = self.conv1(x)
        if self.sequence is not None:
            x = self.sequence(x)
        else:
            for b in self.blocks:
                x1, x2 = torch.chunk(x, 2, dim=1)
                y1 = x1 + b.f_block(x2)
                y2 = x2 + b.g_block(y1)
                x = torch.cat([y1, y2], dim=1)
        x = self.conv2(F.relu(x))
        x = F.avg_pool2d(x, (x.shape[2], x.shape[3]))
        return x.view(x.shape[0], x.shape[1])


def invtorch_net(plain: bool):
    """invtorch's README layer at size: four invtorch.nn.Linear(256, 256) in its
    Sequential; `plain`: the same four as torch.nn.Linear (weights materialised)."""
    import invtorch.nn as inn

    torch.manual_seed(0)
    inv = inn.Sequential(*[inn.Linear(256, 256) for _ in range(4)])
    if not plain:
        return inv
    plain_net = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    with torch.no_grad():
        for p, q in zip(plain_net, inv):
            p.weight.copy_(q.weight)
            p.bias.copy_(q.bias)
    return plain_net


def ways(make, x):
    eager = make(True)
    peer = make(False)
    peer.load_state_dict(eager.state_dict(), strict=False)
    tc = copy.deepcopy(eager)
    mc = copy.deepcopy(eager)
    mo = copy.deepcopy(eager)
    return [
        ("eager (plain)", eager, eager),
        ("the peer's wrapper", peer, peer),
        ("torch.compile (plain)", torch.compile(tc, dynamic=False), tc),
        ("memslim.compile (plain)", memslim.compile(mc, dynamic=False), mc),
        ("memslim.optimize (plain)", memslim.optimize(mo, (x,)), mo),
    ]


def params_of(model):
    """Parameters in a fixed order (invtorch's parametrised weights: the originals)."""
    return [p for _, p in sorted(model.named_parameters())]


def measure(make, x, rounds):
    torch._dynamo.reset()
    ws = ways(make, x)
    ref = grads(ws[0][1], params_of(ws[0][2]), x)
    e64 = make(True).double()
    ref64 = [g.float() for g in grads(e64, params_of(e64), x.double())]
    names = [n for n, _ in sorted(ws[0][2].named_parameters())]
    rows = []
    for name, model, base in ws:
        grads(model, params_of(base), x)  # compiles; the chains' first call
        g = grads(model, params_of(base), x)
        # Fresh inputs each: invtorch's way frees its input's storage in forward.
        saved = memslim.saved_bytes(model, x.clone().requires_grad_())
        alive = alive_bytes(model, x.clone().requires_grad_()) if model is base else None

        peak = step_peak_bytes(lambda model=model, base=base: train_step(model, base, x))
        if [n for n, _ in sorted(base.named_parameters())] != names:
            # invtorch's parameters are its parametrisation's originals: the input's only
            g, r, r64 = g[:1], ref[:1], ref64[:1]
        else:
            r, r64 = ref, ref64
        rows.append(
            dict(
                way=name,
                saved=saved,
                alive=alive,
                peak=peak,
                grad=max_rel(g, r),
                grad64=max_rel(g, r64),
                input_only=len(g) == 1,
            )
        )
    ratios, tc = time_ratios(ws, x, rounds, "torch.compile (plain)")
    for r in rows:
        r["time"] = ratios[r["way"]]
    return rows, chains(ws[3][1]), tc


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"# revtorch's and invtorch's README networks through memslim ({datetime.date.today()})",
        "",
        f"commit {commit}, torch {torch.__version__}, threads {torch.get_num_threads()}, CPU, "
        f"fp32; `bench/peer_examples.py --rounds {a.rounds} --batch {a.batch}`. Method: this "
        "script's docstring.",
        "",
    ]
    torch.manual_seed(1)
    cases = [
        (
            f"revtorch 0.2.4 PartiallyReversibleNet (batch {a.batch}, 3x32x32)",
            lambda plain: PartiallyReversibleNet(plain),
            torch.randn(a.batch, 3, 32, 32),
        ),
        (
            "invtorch 0.5.0: four invtorch.nn.Linear(256, 256) (1,024 rows)",
            invtorch_net,
            torch.randn(1024, 256),
        ),
    ]
    for title, make, x in cases:
        rows, chains, tc = measure(make, x, a.rounds)
        lines += [
            f"## {title}",
            "",
            f"memslim.compile's chains: {chains or 'none'}; torch.compile's step "
            f"{tc * 1e3:.1f} ms (median of {a.rounds}).",
            "",
            "| way | saved B | alive B | step peak B | step time / torch.compile (median "
            "[quartiles]) | grad vs eager fp32 | vs eager fp64 |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            t = r["time"]
            only = " (input)" if r["input_only"] else ""
            lines.append(
                f"| {r['way']} | {r['saved']:,} | {fmt(r['alive'], ',')} | {r['peak']:,} | "
                f"{t[0]:.2f} [{t[1]:.2f}, {t[2]:.2f}] | {fmt(r['grad'], '.1e')}{only} | "
                f"{fmt(r['grad64'], '.1e')}{only} |"
            )
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
