"""The fuzz judge's TorchScript leg: memslim.optimize of the program, against the reference.

What: `run_optimize` (the `optimize` and `optimized-run` stages: memslim.optimize of a
fresh module, called OPT_RUNS times and judged against the reference, a mismatch
reclassified as bf16 / fp32 rounding or as another order of random draws) and
`rng_order_only` (that last check).
Why: one module per stage of runner.py's judge; its shared helpers are runner_common.py.
"""

from __future__ import annotations

import math
from typing import Dict


from runner_common import (
    OPT_RUNS,
    Reference,
    Stage,
    _optimize_kw,
    call,
    compare,
    first_line,
    fp32_twin_ok,
    fp64_twin_same,
    trainable,
)


def _reclassify(prog, inputs, R: Reference, got: dict, run: int, w: dict, verdict: tuple):
    """A wrong call of the optimized module that is rounding (bf16: its fp32 twin passes,
    fp32_twin_ok; fp32: its fp64 twin matches, fp64_twin_same) or only another order of
    random draws (rng_order_only) is classed so; else the verdict stands."""
    if R.dtype == "bfloat16" and math.isfinite(w["rel"]) and fp32_twin_ok(prog, inputs):
        return (
            "bf16-rounding",
            "optimize",
            verdict[2] + "; the fp32 twin of this program (same values) passes the fp32 bars",
        )
    if R.dtype == "float32" and fp64_twin_same(prog, inputs, got, R):
        return (
            "fp32-rounding",
            "optimize",
            verdict[2] + "; the fp64 twin "
            "through memslim.optimize matches fp64 eager within 1e-9, and "
            "the fp32 error is within 4 x eager's own against fp64",
        )
    if R.rand and run > 0 and rng_order_only(prog, inputs, R):
        return (
            "rng-order",
            "optimize",
            verdict[2] + "; with "
            "torch.jit.optimized_execution(False) every call matches eager: "
            "the optimizing executor draws this module's random numbers in "
            "another order than the unmodified module's",
        )
    return verdict


def run_optimize(prog, inputs, R: Reference, stage: Stage, res: dict) -> list:
    """memslim.optimize's leg (the `optimize` and `optimized-run` stages): a fresh module
    through memslim.optimize, called OPT_RUNS times and judged against R. Its verdicts:
    none (ok) or one (class, stage, detail). Records the rewrites (by pass) and the
    largest error in res."""
    import memslim

    verdicts = []
    stage("optimize")
    try:
        m2, inputs2 = prog.make()
        opt = memslim.optimize(m2, example_inputs=inputs2, **_optimize_kw())
        by_pass: Dict[str, int] = {}
        for d in memslim.report(opt):
            if d.verdict == "rewrote":
                by_pass[d.pass_] = by_pass.get(d.pass_, 0) + 1
        res["rewrites"] = sum(by_pass.values())
        res["rewrites_by_pass"] = by_pass
    except Exception as e:
        verdicts.append(("exception", "optimize", first_line(e)))
        opt = None
    if opt is not None:
        stage("optimized-run")
        try:
            for run in range(OPT_RUNS):
                got = call(opt, inputs, trainable(opt))
                stats = {}
                w = compare(R, got, run, stats)
                res["opt_err"] = max(res.get("opt_err", 0.0), stats.get("err", 0.0))
                if w is not None:
                    verdicts.append(
                        (
                            "wrong",
                            "optimize",
                            "call %d: %s rel %.3g > bar %.3g %s"
                            % (run + 1, w["tensor"], w["rel"], w.get("bar", 0), w["why"]),
                        )
                    )
                    verdicts[-1] = _reclassify(prog, inputs, R, got, run, w, verdicts[-1])
                    break
        except Exception as e:
            verdicts.append(("exception", "optimized-run", first_line(e)))
    return verdicts


def rng_order_only(prog, inputs, R: Reference) -> bool:
    """Whether a random program's mismatch goes away when the executor does not
    optimize (it then runs the graph's nodes in order: same draws as eager). A fresh
    optimized module: an executor keeps the plan of its first calls."""
    import torch
    import memslim

    try:
        m, inputs2 = prog.make()
        opt = memslim.optimize(m, example_inputs=inputs2, **_optimize_kw())
        with torch.jit.optimized_execution(False):
            for run in range(OPT_RUNS + 1):
                if (
                    compare(
                        Reference(R.dtype, R.eager, R.drift, [], True, R.truth),
                        call(opt, inputs, trainable(opt)),
                        run,
                    )
                    is not None
                ):
                    return False
    except Exception:  # noqa: BLE001
        return False
    return True
