"""The fuzz judge's shared helpers: running a program, comparing runs, the rounding twins.

What: the constants (RUN_SEED, call counts, the bars BARS / DRIFT_FACTOR / DRIFT_CAP),
loading a program's source, one forward + gradient run (`call`), relative errors, the
`Reference` a rewritten module is judged against and `compare`, the worker's `Stage`
reporter, and the checks every stage shares: `is_random`, `sensitivity`, the dtype twins
(`fp32_twin_ok` for bf16, `fp64_twin_same` for fp32) through either front end.
Why: runner.py (the per-program judge) and its stage modules (runner_torchscript.py,
runner_fx.py, runner_compile.py, runner_cli.py) all judge with these; torch is imported
lazily, inside the functions (the parent process never loads it).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

if TYPE_CHECKING:  # torch is imported lazily: the parent process never loads it
    import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RUN_SEED = 1234
SCRIPTED_RUNS = 2
OPT_RUNS = 2

# Bars (relative L2 per output / gradient; how they combine: Reference). fp32/fp64:
# 1e-4, memslim-opt --verify's bar. bf16: 2e-2, measured: the unmodified scripted
# module's own drift against eager reaches 1.5e-2 on non-random bf16 programs
# (bench/results/fuzz_long.md has the distribution).
BARS = {"float32": 1e-4, "float64": 1e-4, "bfloat16": 2e-2}
DRIFT_FACTOR = 4.0
DRIFT_CAP = 10.0


# --------------------------------------------------------------------------
# Executing and comparing (inside a worker)
# --------------------------------------------------------------------------


def _optimize_kw() -> dict:
    """MEMSLIM_FUZZ_PASSES=a,b,...: memslim.optimize runs these passes instead of
    memslim-default (e.g. the default list plus recompute-blocks, to fuzz a pass that is
    not in the pipeline)."""
    passes = os.environ.get("MEMSLIM_FUZZ_PASSES", "")
    return {"passes": passes.split(",")} if passes else {}


def load_source(source: str, path: str):
    """Imports `source` from `path` (torch.jit.script needs the file for inspect)."""
    with open(path, "w") as f:
        f.write(source)
    name = "fuzzprog_%d_%d" % (os.getpid(), abs(hash(path)) % 10**9)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def flatten(out) -> list:
    if isinstance(out, (tuple, list)):
        r = []
        for o in out:
            r += flatten(o)
        return r
    return [out]


def weight(shape, dtype, i):
    import torch

    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def call(module, inputs, params: Dict[str, "torch.Tensor"]):
    """One forward + gradient run: ({"out:i": tensor}, {"grad:...": tensor or None})."""
    import torch

    args, leaves = [], []
    for a in inputs:
        if isinstance(a, torch.Tensor):
            t = a.detach().clone()
            if t.is_floating_point():
                t.requires_grad_(True)
                leaves.append(t)
            args.append(t)
        else:
            args.append(a)
    torch.manual_seed(RUN_SEED)
    outs = flatten(module(*args))
    loss = None
    res = {}
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            res["out:%d" % i] = repr(o)
            continue
        res["out:%d" % i] = o.detach().clone()
        if o.requires_grad and o.is_floating_point():
            term = (o * weight(o.shape, o.dtype, i)).sum()
            loss = term if loss is None else loss + term
    wrt = leaves + list(params.values())
    names = ["grad:input%d" % i for i in range(len(leaves))] + ["grad:" + n for n in params]
    if loss is not None and wrt:
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    else:
        grads = [None] * len(wrt)
    for n, g in zip(names, grads):
        res[n] = None if g is None else g.detach().clone()
    return res


def trainable(module) -> Dict[str, "torch.Tensor"]:
    return {n: p for n, p in module.named_parameters() if p.requires_grad}


def rel_err(ref, got) -> Tuple[float, str]:
    """Relative L2 error of got against ref; inf with a reason for a mismatch of
    structure, shape, dtype or non-finite positions (NaN/inf must stay where aten has them)."""
    import torch

    if isinstance(ref, str) or isinstance(got, str):
        return (0.0, "") if ref == got else (math.inf, "non-tensor output differs")
    if ref is None and got is None:
        return 0.0, ""
    if ref is None:
        ref = torch.zeros_like(got)
    if got is None:
        got = torch.zeros_like(ref)
    if ref.shape != got.shape:
        return math.inf, "shape %s vs %s" % (tuple(ref.shape), tuple(got.shape))
    if ref.dtype != got.dtype:
        return math.inf, "dtype %s vs %s" % (ref.dtype, got.dtype)
    a, b = ref.double(), got.double()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb):
        n = int((fa != fb).sum())
        return math.inf, "non-finite pattern differs at %d elements (ref %d non-finite, got %d)" % (
            n,
            int((~fa).sum()),
            int((~fb).sum()),
        )
    if not torch.equal(torch.isnan(a), torch.isnan(b)) or not torch.equal(
        a[~fa & ~torch.isnan(a)], b[~fa & ~torch.isnan(a)]
    ):
        return math.inf, "NaN/inf values differ"
    a, b = a[fa], b[fa]
    na = float(a.norm())
    d = float((a - b).norm())
    if d == 0.0:
        return 0.0, ""
    return (d / na if na > 0 else math.inf), ("" if na > 0 else "reference is 0, got |.|=%.3g" % d)


class Reference:
    """What a rewritten module's call is judged against.

    eager: the eager run; drift: the unmodified scripted module's per-tensor error
    against eager (widens the bar to DRIFT_FACTOR x drift, at most DRIFT_CAP x the base
    bar; not for random programs, where the difference is the RNG, not rounding);
    scripted: the scripted module's calls. A tensor passes if it matches eager, or the
    scripted module's call with the same index within the base bar: the rewritten module
    is a TorchScript module, and where TorchScript itself differs from eager (dropout
    masks drawn by the optimizing executor; an eval-mode dropout that aliases its input
    in eager but not in TorchScript) matching the unmodified scripted module is the
    contract. bf16 programs: eager bf16 is itself far from the exact result, so a tensor
    also passes if its error against the fp64 run of the same (bf16-valued) parameters and
    inputs is within max(bar, DRIFT_FACTOR x eager bf16's own error against it): memslim
    may round differently (silu rounds once where x * sigmoid(x) rounds twice), but not
    be less accurate than eager by more than that factor."""

    def __init__(self, dtype, eager, drift, scripted, rand, truth=None, sens=None):
        self.dtype, self.eager, self.drift, self.scripted, self.rand = (
            dtype,
            eager,
            drift,
            scripted,
            rand,
        )
        self.truth = truth
        self.sens = sens or {}  # per tensor: eager's own change under a few-ulp perturbation
        self.truth_err = {}
        if truth is not None:
            for k in eager:
                self.truth_err[k] = rel_err(truth[k], up64(eager[k]))[0]


def up64(t):
    import torch

    return t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def compare(R: Reference, got: dict, index: int, stats: Optional[dict] = None):
    """Worst violation of the bars (see Reference), or None. stats receives the
    smallest error over the references of the worst tensor ("err")."""
    ref = R.eager
    if set(ref) != set(got):
        return {
            "tensor": "structure",
            "rel": math.inf,
            "bar": 0.0,
            "why": "outputs/gradients differ: %s vs %s" % (sorted(ref), sorted(got)),
        }
    base = BARS[R.dtype]
    worst = None
    for k in ref:
        rel, why = rel_err(ref[k], got[k])
        d = 0.0 if R.rand else R.drift.get(k, 0.0)
        bar = min(max(base, DRIFT_FACTOR * d), DRIFT_CAP * base) if math.isfinite(d) else base
        sens = R.sens.get(k, 0.0)
        if 0.1 < sens < math.inf:
            # Rounding noise: a few ulps on the inputs move eager's own value by more
            # than a tenth of it (a gradient that sums to zero: a bias before a BatchNorm;
            # long-fuzz seeds 402430, 402671; 511470 moved 0.41 with 1 thread, 0.90 with
            # 2: the measure of noise is itself noisy, so the threshold is well below
            # the 0.5 it was). Judged at the scale of that noise.
            bar = max(bar, DRIFT_FACTOR * sens)
        err = rel
        ok = rel <= bar
        notes = []
        if not ok and R.scripted:
            alt = R.scripted[min(index, len(R.scripted) - 1)]
            rel2, _ = rel_err(alt[k], got[k])
            err = min(err, rel2)
            ok = rel2 <= base
            notes.append("scripted call %d: %.3g" % (index + 1, rel2))
        if not ok and R.truth is not None:
            rel3, _ = rel_err(R.truth[k], up64(got[k]))
            te = R.truth_err.get(k, math.inf)
            bar3 = max(base, DRIFT_FACTOR * te) if math.isfinite(te) else base
            ok = rel3 <= bar3
            notes.append("fp64: %.3g (eager bf16: %.3g)" % (rel3, te))
        if stats is not None and math.isfinite(err):
            stats["err"] = max(stats.get("err", 0.0), err)
        if not ok and (worst is None or rel / bar > worst["rel"] / max(worst["bar"], 1e-300)):
            worst = {
                "tensor": k,
                "rel": rel,
                "bar": bar,
                "why": (why + " " + "; ".join(notes)).strip(),
            }
    return worst


def first_line(e: BaseException) -> str:
    """The error's first line; for TorchScript interpreter errors also its last (the cause)."""
    lines = [
        ln for ln in ("%s: %s" % (type(e).__name__, str(e).strip())).splitlines() if ln.strip()
    ]
    msg = lines[0]
    if "TorchScript" in msg and len(lines) > 1:
        msg += " ... " + lines[-1].strip()
    return msg[:500]


class Stage:
    """Reports the stage a worker is entering (a crash is blamed on it); times stages."""

    def __init__(self, report: Callable[[dict], None]):
        self.report = report
        self.times: Dict[str, float] = {}
        self.cur, self.t = None, time.time()

    def __call__(self, name: str):
        now = time.time()
        if self.cur:
            self.times[self.cur] = round(self.times.get(self.cur, 0.0) + now - self.t, 3)
        self.cur, self.t = name, now
        self.report({"stage": name})


def sensitivity(prog, inputs, ref: dict, dtype: str, rand: bool) -> dict:
    """Per output / gradient: eager's own relative change when every floating parameter
    and input is scaled by 1 + 8 ulps (fp32 / fp64; bf16 has its fp64 reference). Over
    0.1: that tensor is rounding noise. Random programs too, where a fresh unperturbed
    run under the same seed reproduces `ref` exactly (dropout's mask does not depend on
    the values: long-fuzz seeds 510692 / 511470, a bias before a BatchNorm whose gradient
    is 1e-32 / 1e-15, were judged wrong at 0.38 / 0.23 without it)."""
    import torch

    eps = {"float32": 2.0**-20, "float64": 2.0**-49}.get(dtype)
    if eps is None:
        return {}
    try:
        if rand:
            m, _ = prog.make()
            again = call(m, inputs, trainable(m))
            if any(k not in again or not _same(ref[k], again[k]) for k in ref):
                return {}
        m, _ = prog.make()
        with torch.no_grad():
            for p in m.parameters():
                if p.is_floating_point():
                    p.mul_(1 + eps)
        ins = [
            a * (1 + eps) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in inputs
        ]
        got = call(m, ins, trainable(m))
        return {k: rel_err(ref[k], got[k])[0] for k in ref if k in got}
    except Exception:  # noqa: BLE001 - then no tensor counts as noise
        return {}


def _same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a.nan_to_num(), b.nan_to_num())
    return a is None and b is None


def is_random(prog, inputs) -> bool:
    """Whether the program draws random numbers (its eager output depends on the seed)."""
    import torch

    outs = []
    for seed in (RUN_SEED, RUN_SEED + 1):
        m = prog.make()[0]
        torch.manual_seed(seed)
        with torch.no_grad():
            outs.append([o for o in flatten(m(*inputs)) if isinstance(o, torch.Tensor)])
    return any(not torch.equal(a, b) for a, b in zip(*outs) if a.shape == b.shape)


def dtype_twin(prog, inputs, dtype):
    """A fresh module of the program and its inputs, floating tensors cast to `dtype`
    (the same values, widened)."""
    import torch

    m = prog.make()[0].to(dtype)
    return m, [
        a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs
    ]


def _optimized(m, ins, front_end: str):
    """`m` rewritten by one front end: memslim.optimize (TorchScript) or torch.export +
    memslim.fx.optimize (the rewritten program's module)."""
    import torch
    import memslim
    import memslim.fx

    if front_end == "fx":
        ep = torch.export.export(m, tuple(ins))
        return memslim.fx.optimize(ep).module()
    return memslim.optimize(m, example_inputs=ins, **_optimize_kw())


def fp32_twin_ok(prog, inputs, front_end: str = "torchscript") -> bool:
    """A bf16 program's fp32 twin (its bf16 parameters and inputs, widened) through eager,
    the scripted module and memslim.optimize, judged with the fp32 bars. bf16 results sit
    on a coarse grid: a rewrite that rounds differently (silu rounds once where
    x * sigmoid(x) rounds twice) can flip a downstream comparison (where(v > 0), relu,
    clamp) that eager's rounding left alone, far beyond any relative bar, with the
    rewrite itself exact. Such a bf16 mismatch whose fp32 twin passes is counted as
    bf16-rounding, not as wrong."""
    import torch

    try:
        m, ins = dtype_twin(prog, inputs, torch.float32)
        ref = call(m, ins, trainable(m))
        sm = torch.jit.script(dtype_twin(prog, inputs, torch.float32)[0])
        sruns = [call(sm, ins, trainable(sm)) for _ in range(SCRIPTED_RUNS)]
        drift = {k: max(rel_err(ref[k], r[k])[0] for r in sruns) for k in ref}
        R = Reference("float32", ref, drift, sruns, is_random(prog, inputs))
        m2, ins2 = dtype_twin(prog, inputs, torch.float32)
        opt = _optimized(m2, ins2, front_end)
        return all(
            compare(R, call(opt, ins, trainable(opt)), run) is None for run in range(OPT_RUNS)
        )
    except Exception:  # noqa: BLE001
        return False


def _abs_err(ref, got) -> float:
    """L2 norm of got - ref in fp64 (None: zeros); inf for a mismatch of shape."""
    import torch

    if ref is None and got is None:
        return 0.0
    ref = torch.zeros_like(got) if ref is None else ref
    got = torch.zeros_like(ref) if got is None else got
    if not isinstance(ref, torch.Tensor) or ref.shape != got.shape:
        return math.inf
    return float((up64(got) - up64(ref)).norm())


def fp64_twin_same(prog, inputs, got: dict, R: Reference, front_end: str = "torchscript") -> bool:
    """Whether an fp32 mismatch is rounding of the same function. For every tensor over the
    base bar: memslim.optimize of the program's fp64 twin (same values) matches fp64 eager
    within 1e-9 (the rewrite computes the same function), the rewritten module's fp32
    result is within 1e-3 of eager's, and against fp64 eager its error is at most 4 x
    eager's own fp32 error, unless eager's own error is over 1e-3 (a where() or comparison
    takes other branches in fp32, or a sum cancels: fp32 says nothing at that level).
    memslim-opt --verify judges the same way. Long-fuzz seeds 144211 (gradients 1.58e-4
    apart in fp32, eager's own error 4e-4, fp64 twins 1e-16 apart) and 181052. Random
    programs too (as --verify): every call, the twins included, draws from RUN_SEED, and
    a tensor whose fp64 draws differ from fp32 eager's fails the 4 x rule; seed 335273
    (dropout elsewhere; a 0-dim parameter's gradient, a cancelling sum, 1.69e-4 apart,
    eager's own error 3.8e-4, memslim's 5.5e-4, fp64 twins 6e-13 apart). Where eager's
    fp32 value has no digit right (its error against fp64 over 50%), the same evidence in
    absolute terms (see the loop)."""
    import torch

    try:
        m, ins = dtype_twin(prog, inputs, torch.float64)
        truth = call(m, ins, trainable(m))
        m2, ins2 = dtype_twin(prog, inputs, torch.float64)
        opt = _optimized(m2, ins2, front_end)
        got64 = call(opt, ins, trainable(opt))
        base = BARS[R.dtype]
        over = 0
        for k in R.eager:
            rel = rel_err(R.eager[k], got[k])[0]
            if rel <= base:
                continue
            over += 1
            own = rel_err(truth[k], up64(R.eager[k]))[0]
            mine = rel_err(truth[k], up64(got[k]))[0]
            if own > 0.5 and math.isfinite(own):
                # Eager's fp32 value is rounding noise (no digit right: a sum that
                # cancels, e.g. a norm's input gradient summed over its group;
                # fuzz seed 256). Relative bars say nothing there: the fp64 twins
                # must agree far below that noise (the same function), and the
                # rewritten fp32 value must be noise of the same order (within
                # 16x: another summation order; seed 256: 4.6e-6 vs eager's 9.1e-7,
                # fp64 twins 1.7e-15 apart).
                noise = _abs_err(truth[k], R.eager[k])
                if not (
                    _abs_err(truth[k], got64[k]) <= 1e-6 * noise
                    and _abs_err(truth[k], got[k]) <= 16 * noise
                ):
                    return False
                continue
            # A random program's twins must draw what fp32 eager drew (own <= 1e-3):
            # a tensor whose draws differ in fp64 says nothing about rounding.
            # Within 1e-3 of eager, or within 4x eager's own error where that is larger
            # (fuzz seed 400522: a LayerNorm gamma's gradient through a BatchNorm with
            # gammas near 0, eager fp32 1.6e-2 from fp64, memslim 5.8e-3 from eager).
            if not (
                rel <= max(1e-3, 4 * own)
                and rel_err(truth[k], got64[k])[0] <= 1e-9
                and ((own > 1e-3 and not R.rand) or mine <= max(base, 4 * own))
            ):
                return False
        return over > 0
    except Exception:  # noqa: BLE001
        return False
