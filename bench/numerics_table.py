"""Writes the per-op, per-dtype input-gradient error table (docs/measurements.md "Numerics").

Errors are max |dL/dx - reference| with grad_out = 1 (i.e. relative to
|grad_out|); the reference is aten's autograd in float64 on the same rounded
inputs. fp32 inputs: dense sweep of [-20, 20], N(0,1) samples and the region
around each minimum; 16-bit: every representable value in [-20, 20]. "near
min" is |x - x*| <= 0.8. The exact-list column is the fraction of N(0,1)
inputs kept exactly (guard band) and the bytes per element that adds.
Usage: bench/numerics_table.py [--out FILE]
"""

import argparse
import datetime
import math
import sys

import torch

from memslim import _numerics as N

DTYPES = [("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)]


def band_fraction(name, dtype):
    act = name  # the non-monotonic cases are named after their kernel activation
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(1)).to(dtype)
    _, _, idx, val = torch.ops.memslim.activation_forward(x, act, [], True)
    frac = idx.numel() / x.numel()
    return frac, frac * (4 + val.element_size())


def fmt(v):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1e}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    lines = [
        f"Input-gradient error relative to |grad_out|; {datetime.date.today()}, torch {torch.__version__}.",
        "",
        "| op | dtype | memslim max | aten max | memslim near min | aten near min | ratio near min | exact list (N(0,1)) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in N.CASES:
        for label, dtype in DTYPES:
            r = N.table_row(name, dtype)
            nonmono = name in N.NON_MONOTONIC
            ratio = r["near_min_err"] / r["aten_near_min_err"] if nonmono else None
            if nonmono:
                frac, bpe = band_fraction(name, dtype)
                band = f"{100 * frac:.2f}% ({bpe:.3f} B/elem)"
            else:
                band = "-"
            lines.append(
                f"| {name} | {label} | {fmt(r['max_err'])} | {fmt(r['aten_max_err'])} | "
                f"{fmt(r['near_min_err'] if nonmono else None)} | "
                f"{fmt(r['aten_near_min_err'] if nonmono else None)} | "
                f"{'-' if ratio is None else f'{ratio:.2f}x'} | {band} |"
            )
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("Command: `.venv/bin/python " + " ".join(sys.argv) + "`\n\n")
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
