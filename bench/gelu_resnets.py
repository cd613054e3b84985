"""Saved-for-backward bytes of torchvision ResNets with every ReLU swapped for GELU:
eager, unmodified scripted, and memslim.optimize, at 128x3x32x32 fp32 (issue 3's setting).
Usage: bench/gelu_resnets.py [--batch 128] [--out FILE]"""

import argparse
import datetime
import sys
import warnings

import torch

import memslim
from memslim._models import gelu_resnet

warnings.filterwarnings("ignore", message=r".*torch\.jit\.(script|save|load).*deprecated")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    x = torch.randn(a.batch, 3, 32, 32)
    lines = [
        f"Saved-for-backward bytes, GELU ResNets, {a.batch}x3x32x32 fp32; {datetime.date.today()}, torch {torch.__version__}",
        "",
        "| model | eager | scripted | memslim | vs scripted | predicted freed | measured freed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arch in ("resnet18", "resnet50"):
        eager = memslim.saved_bytes(gelu_resnet(arch), x)
        scripted = memslim.saved_bytes(torch.jit.script(gelu_resnet(arch)), x)
        o = memslim.optimize(gelu_resnet(arch), (x,))
        ours = memslim.saved_bytes(o, x)
        pred = memslim.predicted_bytes_freed(o)
        lines.append(
            f"| {arch} | {eager:,} | {scripted:,} | {ours:,} | {100 * (ours - scripted) / scripted:.1f}% | {pred:,} | {scripted - ours:,} |"
        )
        print(lines[-1], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write(
                "Command: `.venv/bin/python "
                + " ".join(sys.argv)
                + "`\n\n"
                + "\n".join(lines)
                + "\n"
            )


if __name__ == "__main__":
    main()
