"""Generates kernels/include/memslim/kernels/derivative_tables.h.

What: for each non-monotonic activation (gelu, gelu_tanh, silu, mish), its
derivative f'(x) as a piecewise polynomial of the saved output y and the branch
bit, without recovering x: the fp32 backward evaluates one polynomial per
element instead of inverting f (a fit, then erfc / exp for a Newton step).
Why: issue 13, inverting backwards at memory speed. x is an analytic function
of t = sqrt(y - y*) through the minimum, so f'(x(t)) is too; the left tail,
where x -> -inf as y -> 0-, is f'/y as a function of w = sqrt(-2 log(-y))
(~|x|), so its error stays relative to the tiny y there.

Layout: two tables per activation, of 8 pieces (what one AVX2 vpermps selects
among; the AVX2 loops) and of 32 (one AVX-512 vpermt2ps; the AVX-512 loops and
the scalar function, CUDA's): more pieces, lower degree, less work per element.
  right branch (bit set): `r` pieces uniform in t over [0, t(x_end)]; beyond
    x_end, f' = 1 to within 5e-8.
  left branch, y <= left_end: `l` pieces uniform in t over [0, t(x_left)].
  left tail, y > left_end: `8 - r - l` pieces uniform in w, f' = y * p(w),
    clamped at the tail's far end (there |f'| < 1e-14).
In piece p with local coordinate s in [-1, 1], f' = sum_k coef[k][p] s^k
(Horner). The split (r, l) and the common degree are the smallest whose
largest error, float32 Horner against float64, is <= TARGET.
Run: .venv/bin/python tools/gen_derivative_tables.py > kernels/include/memslim/kernels/derivative_tables.h
"""

import math
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from gen_inverse_fits import K, closing, gelu, gelu_tanh, mish, preamble, silu

PIECE_COUNTS = (8, 32)  # AVX2's vpermps selects among 8, AVX-512's vpermt2ps among 32
TARGET = 1.5e-7  # aten's own fp32 backward is off by up to 2.8e-7 (gelu) .. 1e-6
MAX_DEG = 14
SAMPLES = 8001


def dgelu(x):
    return 0.5 * math.erfc(-x / math.sqrt(2)) + x * math.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def dsilu(x):
    s = 1 / (1 + math.exp(-x))
    return s * (1 + x * (1 - s))


def dgelu_tanh(x):
    u = K * (x + 0.044715 * x**3)
    s2 = 1 / (1 + math.exp(-2 * u)) if u > -350 else 0.0
    du = K * (1 + 3 * 0.044715 * x * x)
    return s2 + 2 * x * s2 * (1 - s2) * du


def dmish(x):
    sp = x if x > 20 else math.log1p(math.exp(x))
    t = math.tanh(sp)
    s = 1 / (1 + math.exp(-x))
    return t + x * s * (1 - t * t)


# name, f, f', x*, y*, left-branch end (x), left-tail end (x): inverse_fits.h's ranges
ACTS = [
    ("Gelu", gelu, dgelu, -0.75179152469356445747, -0.16997120747990366169, -2.0, -8.0),
    (
        "GeluTanh",
        gelu_tanh,
        dgelu_tanh,
        -0.75246142207101625849,
        -0.17004075057125405064,
        -2.0,
        -6.0,
    ),
    ("Silu", silu, dsilu, -1.2784645427610737951, -0.27846454276107379511, -4.0, -30.0),
    ("Mish", mish, dmish, -1.1924312145154952121, -0.30884341301725040663, -4.0, -30.0),
]


def invert(f, y, lo, hi, increasing):
    """Vectorised bisection: f(x) = y for arrays y on a bracket [lo, hi]."""
    fv = np.vectorize(f)
    lo = np.full_like(y, lo)
    hi = np.full_like(y, hi)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        below = (fv(mid) < y) == increasing
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def right_end(df):
    """Smallest x (0.01 grid) from which |f'(x) - 1| <= 5e-8 for good."""
    for x in np.arange(40.0, 0.0, -0.01):
        if abs(df(x) - 1) > 5e-8:
            return round(x + 0.01, 2)
    raise ValueError("no right end")


def branch_samples(act):
    name, f, df, xs, ys, xl, xt = act
    dfv = np.vectorize(df)
    x_end = right_end(df)
    tr = math.sqrt(f(x_end) - ys)
    tl = math.sqrt(f(xl) - ys)
    wa = math.sqrt(-2 * math.log(-f(xl)))
    wb = math.sqrt(-2 * math.log(-f(xt)))
    t = np.linspace(0, tr, SAMPLES)
    right = (t, dfv(invert(f, ys + t * t, xs, x_end + 1, True)), None)
    t = np.linspace(0, tl, SAMPLES)
    left = (t, dfv(invert(f, ys + t * t, xt - 2, xs, False)), None)
    w = np.linspace(wa, wb, SAMPLES)
    y = -np.exp(-w * w / 2)
    tail = (w, dfv(invert(f, y, xt - 2, xs, False)) / y, -y)
    return dict(x_end=x_end, tr=tr, tl=tl, wa=wa, wb=wb, right=right, left=left, tail=tail)


def fit_branch(samples, pieces, deg):
    """Float32 monomial coefficients per piece, and the largest error of their
    float32 Horner evaluation (times |y| for the tail: the error in f')."""
    v, d, scale = samples
    edges = np.linspace(v[0], v[-1], pieces + 1)
    coefs, worst = [], 0.0
    for j in range(pieces):
        a, b = edges[j], edges[j + 1]
        m = (v >= a) & (v <= b)
        s = 2 * (v[m] - a) / (b - a) - 1
        c = np.polynomial.chebyshev.chebfit(s, d[m], deg)
        pc = np.polynomial.chebyshev.cheb2poly(c).astype(np.float32)
        s32 = s.astype(np.float32)
        p = np.full_like(s32, pc[-1])
        for k in range(deg - 1, -1, -1):
            p = p * s32 + pc[k]
        err = np.abs(p.astype(np.float64) - d[m])
        if scale is not None:
            err = err * scale[m]
        worst = max(worst, float(err.max()))
        coefs.append(pc)
    return coefs, worst


def best_table(job):
    act, pieces = job
    smp = branch_samples(act)
    for deg in range(3, MAX_DEG + 1):
        errs = {}
        for br in ("right", "left", "tail"):
            errs[br] = {n: fit_branch(smp[br], n, deg) for n in range(1, pieces - 1)}
        best = None
        for r in range(1, pieces - 1):
            for l in range(1, pieces - r):  # noqa: E741
                t = pieces - r - l
                fits = [errs["right"][r], errs["left"][l], errs["tail"][t]]
                err = max(e for _, e in fits)
                if best is None or err < best[0]:
                    best = (err, (r, l, t), fits)
        if best[0] <= TARGET:
            return act, pieces, smp, deg, best
    raise ValueError(f"{act[0]}: no {pieces}-piece table within {TARGET} up to degree {MAX_DEG}")


def f32(v):
    return repr(float(np.float32(v))) + "f"


def emit(out, act, pieces, smp, deg, best):
    name, f, df, xs, ys, xl, xt = act
    err, (r, l, t), fits = best  # noqa: E741  (l: the left pieces, as in the docstring)
    right_y = f(smp["x_end"])
    left_y = f(xl)
    coef = [[0.0] * pieces for _ in range(deg + 1)]
    p = 0
    for coefs, _ in fits:
        for pc in coefs:
            for k in range(deg + 1):
                coef[k][p] = pc[k]
            p += 1
    v0 = [0.0, 0.0, smp["wa"]]
    v1 = [smp["tr"], smp["tl"], smp["wb"]]
    n = [r, l, t]
    scale = [n[b] / (v1[b] - v0[b]) for b in range(3)]
    out.append(
        f"// {name}, {pieces} pieces: right x in [x*, {smp['x_end']}] ({r}), left x in [{xl}, x*] ({l}),"
    )
    out.append(
        f"// tail x in [{xt}, {xl}] ({t}, times y); degree {deg}, max error {err:.2e} (float32 Horner)."
    )
    cname = f"k{name}Coef{pieces}"
    # The coefficients once, as a macro; the host array and CUDA's __device__ copy
    # (device code cannot index a constexpr array) both read it.
    macro = f"MEMSLIM_{name.upper()}_COEF{pieces}"
    out.append(f"// [k * {pieces} + p]: the coefficient of s^k in piece p.")
    out.append(f"#define {macro} \\")
    out += [
        "  " + ", ".join(f32(c) for c in coef[k]) + ("," if k < deg else "") + " \\"
        for k in range(deg + 1)
    ]
    out[-1] = out[-1][:-2]
    out.append(f"constexpr float {cname}[] = {{{macro}}};")
    out.append("#if defined(__CUDACC__)")
    out.append(f"static __device__ const float {cname}Dev[] = {{{macro}}};")
    out.append("#endif")
    out.append(f"#undef {macro}")
    out.append(f"struct {name}Deriv{pieces} {{")
    out.append(f"  static constexpr int kPieces = {pieces};")
    out.append(f"  static constexpr int kDegree = {deg};")
    out.append(f"  static constexpr float kRightEnd = {f32(right_y)};  // y beyond: f' = 1")
    out.append(
        f"  static constexpr float kLeftEnd = {f32(left_y)};  // left branch, y above: the tail"
    )
    out.append("  // Per branch: variable start, pieces per unit of it, pieces, first piece.")
    for b, bn in enumerate(("Right", "Left", "Tail")):
        out.append(
            f"  static constexpr float kV0{bn} = {f32(v0[b])}, kScale{bn} = {f32(scale[b])}, "
            f"kPieces{bn} = {n[b]}.f, kBase{bn} = {[0, r, r + l][b]}.f;"
        )
    out.append(f"  static constexpr const float* kCoef = {cname};")
    out.append("  MEMSLIM_HD static float coef(int i) {")
    out.append("#if defined(__CUDA_ARCH__)")
    out.append(f"    return {cname}Dev[i];")
    out.append("#else")
    out.append(f"    return {cname}[i];")
    out.append("#endif")
    out.append("  }")
    out.append("};")
    out.append("")


def main():
    jobs = [(act, pieces) for act in ACTS for pieces in PIECE_COUNTS]
    with ProcessPoolExecutor(max_workers=2) as ex:
        results = list(ex.map(best_table, jobs))
    out = preamble(
        "derivative_tables.h - f'(x) from the saved output, fp32 (generated)",
        [
            "Generated by tools/gen_derivative_tables.py; do not edit. For each",
            "non-monotonic activation, f'(x) as a piecewise polynomial of the saved",
            "output y and the branch bit (see the generator for the layout). Evaluated",
            "by derivative_from_table (activations.h) and, 8 or 16 lanes at a time, by",
            "the AVX2 (8 pieces) / AVX-512 (32) CPU loops.",
        ],
        "tables",
    )
    for act, pieces, smp, deg, best in results:
        emit(out, act, pieces, smp, deg, best)
        print(
            f"{act[0]} ({pieces}): degree {deg}, pieces {best[1]}, max error {best[0]:.2e}",
            file=sys.stderr,
        )
    out += closing("tables")
    print("\n".join(out))


if __name__ == "__main__":
    main()
