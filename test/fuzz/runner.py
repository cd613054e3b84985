"""Runs fuzzer programs differentially and classifies them (issue 9).

One program (the source `gen.py` prints, or any file with `make()`) runs:
  eager            the reference: outputs and every gradient (inputs and parameters)
  scripted         torch.jit.script of the unmodified module, called twice (the
                   profiling executor's first call and its optimized second call):
                   TorchScript's own drift against eager, which widens the bar
  optimize         memslim.optimize(module, example_inputs=inputs), called twice
  fx               torch.export.export of a fresh module -> memslim.fx.optimize -> its
                   .module() against eager (issue 10's FX front end; MEMSLIM_FUZZ_FX=0
                   skips it). Random programs, programs torch.export cannot take and
                   programs whose unrewritten export already misses the bars are
                   `limitation`s of this stage
  cli              torch.jit.save of the scripted module -> `memslim-opt --pipeline=
                   memslim-default --input-shapes=... --verify -o out.pt`, and out.pt
                   itself run against eager
Before each forward the RNG is seeded with RUN_SEED (dropout programs draw the same
mask everywhere); the loss is sum_i <out_i, w_i> with fixed random w_i.

Classes: ok, wrong (an output or gradient beyond the bar, see Reference), crash (a
signal, in the worker or in memslim-opt), exception (memslim raised / the optimized
module raised where eager and the scripted module work: a refusal of a valid program),
timeout, bf16-rounding (a bf16 mismatch whose fp32 twin passes: see fp32_twin_ok; reported,
not failing), fp32-rounding (an fp32 mismatch whose fp64 twin through memslim.optimize
matches fp64 eager within 1e-9, with the fp32 error within 4 x eager's own against fp64:
see fp64_twin_same; reported, not failing), rng-order (a random program whose optimized module matches eager call for
call when TorchScript's executor does not optimize, but draws its dropout masks in
another order than the unmodified scripted module under the optimizing executor: not a
wrong result, a reproducibility finding), invalid (eager, scripting or the scripted
module failed: the generator's or TorchScript's fault; discarded and counted). A stage that cannot take the program (memslim-opt: fp64/bf16
programs, whose untyped archive inputs --input-shapes makes fp32) is recorded as
`limitation: ...`, never as a pass.

Programs run in worker subprocesses (`Pool`), one program at a time per worker and
many per worker lifetime; a worker that dies takes only the program it was running
(the worker reports each stage before entering it), and a fresh worker continues.

Files: this one holds the per-program judge (`check_source`, in named steps) and the
worker's entry point (`runner.py worker`); runner_common.py the shared helpers (running,
comparing, the bars, the rounding twins); one module per stage: runner_torchscript.py
(memslim.optimize), runner_fx.py (torch.export + memslim.fx), runner_compile.py
(memslim.compile), runner_cli.py (memslim-opt); runner_pool.py the parent side (workers,
sessions, the pool). The names other files use (runner.Pool, runner.Session,
runner.Reference, runner.compare, runner.BARS, ...) stay importable from here.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from typing import Callable, Dict, Optional


# The helpers, the stages and the pool, re-exported: fuzz.py, shrink.py, bench/fuzz_long.py
# and the tests use them as runner.Pool, runner.Reference, ...
from runner_cli import MemslimOpt, default_memslim_opt, memslim_opt_runner, run_cli  # noqa: F401
from runner_common import (  # noqa: F401
    BARS,
    DRIFT_CAP,
    DRIFT_FACTOR,
    HERE,
    OPT_RUNS,
    REPO,
    RUN_SEED,
    SCRIPTED_RUNS,
    Reference,
    Stage,
    _abs_err,
    _optimize_kw,
    _optimized,
    _same,
    call,
    compare,
    dtype_twin,
    first_line,
    flatten,
    fp32_twin_ok,
    fp64_twin_same,
    is_random,
    load_source,
    rel_err,
    sensitivity,
    trainable,
    up64,
    weight,
)
from runner_compile import run_compile_budget  # noqa: F401
from runner_fx import run_fx  # noqa: F401
from runner_peak import run_compile_peak  # noqa: F401
from runner_pool import Pool, Session, Worker, run_job  # noqa: F401
from runner_torchscript import rng_order_only, run_optimize  # noqa: F401


class _Invalid(Exception):
    """The program failed before any memslim stage: eager, scripting or the scripted module
    (the generator's or TorchScript's fault; classed invalid)."""

    def __init__(self, stage: str, detail: str):
        super().__init__(detail)
        self.stage, self.detail = stage, detail


def _features(source: str) -> list:
    """The features a generated program lists in its header (none for other sources)."""
    feats = []
    for ln in source.splitlines()[:10]:
        if ln.startswith("# features:"):
            feats = ln.split(":", 1)[1].split()
    return feats


def _load(source: str, workdir: str, stage: Stage):
    """The `load` stage: (program module, module, inputs, dtype name); _Invalid if it fails."""
    import torch

    stage("load")
    try:
        prog = load_source(source, os.path.join(workdir, "prog.py"))
        m, inputs = prog.make()
        dtype = (
            str(next(iter(m.parameters())).dtype).replace("torch.", "")
            if list(m.parameters())
            else str([a for a in inputs if isinstance(a, torch.Tensor)][0].dtype).replace(
                "torch.", ""
            )
        )
    except Exception as e:
        raise _Invalid("load", first_line(e)) from None
    return prog, m, inputs, dtype


def _scripted_runs(prog, inputs, ref: dict, stage: Stage):
    """The `script` stage: the unmodified scripted module's calls and its per-tensor drift
    against eager; _Invalid if scripting or a call fails."""
    import torch

    stage("script")
    drift: Dict[str, float] = {}
    sruns = []
    try:
        sm = torch.jit.script(prog.make()[0])
        for _ in range(SCRIPTED_RUNS):
            got = call(sm, inputs, trainable(sm))
            sruns.append(got)
            if set(got) != set(ref):
                raise _Invalid("script", "scripted module's outputs differ in structure")
            for k in ref:
                drift[k] = max(drift.get(k, 0.0), rel_err(ref[k], got[k])[0])
    except _Invalid:
        raise
    except Exception as e:
        raise _Invalid("script", first_line(e)) from None
    return sruns, drift


def _reference(source: str, workdir: str, stage: Stage, res: dict):
    """The reference every memslim stage is judged against: loads the program, runs it eager
    and scripted; (program module, inputs, Reference). Records dtype / random / drift in
    res; raises _Invalid where the program itself fails."""
    import torch

    prog, m, inputs, dtype = _load(source, workdir, stage)
    res["dtype"] = dtype

    stage("eager")
    try:
        ref = call(m, inputs, trainable(m))
    except Exception as e:
        raise _Invalid("eager", first_line(e)) from None
    if all(v is None for k, v in ref.items() if k.startswith("grad:")):
        res["stages"]["note"] = "no gradient reaches any input or parameter"
    rand = is_random(prog, inputs)
    res["random"] = rand

    sruns, drift = _scripted_runs(prog, inputs, ref, stage)
    res["drift"] = max(drift.values()) if drift else 0.0

    truth = None
    if dtype == "bfloat16":
        try:
            m64 = prog.make()[0].to(torch.float64)
            truth = call(m64, [up64(a) for a in inputs], trainable(m64))
        except Exception:  # noqa: BLE001 - then bf16 is judged against eager alone
            truth = None
    R = Reference(
        dtype, ref, drift, sruns, rand, truth, sensitivity(prog, inputs, ref, dtype, rand)
    )
    return prog, inputs, R


def _leg(name: str, run: Callable[[], tuple], res: dict, stage: Stage, verdicts: list):
    """Runs one stage's leg (a (class, stage, detail) verdict): records it in
    res["stages"]; a failure (not ok, not a limitation) joins verdicts."""
    stage(name)
    v = run()
    res["stages"][name] = "ok" if v[0] == "ok" else "%s@%s: %s" % v
    if v[0] not in ("ok", "limitation"):
        verdicts.append(v)


def _worst(verdicts: list) -> tuple:
    """The program's verdict: the first of the most severe class, else ok."""
    for cls in (
        "crash",
        "wrong",
        "exception",
        "budget-miss",
        "peak-miss",
        "rng-order",
        "bf16-rounding",
        "fp32-rounding",
    ):
        for v in verdicts:
            if v[0] == cls:
                return v
    return ("ok", "", "")


def check_source(
    source: str, workdir: str, stage: Stage, memslim_opt: Optional[str], cli: bool = True
) -> dict:
    """Runs one program through every stage; returns its classification."""
    # Imported up front: a memslim that does not import is a runner-error, not a stage's.
    import torch  # noqa: F401
    import memslim  # noqa: F401

    t0 = time.time()
    res = {"class": "ok", "stage": "", "detail": "", "stages": {}}
    res["feats"] = _features(source)

    def done(cls, st, detail):
        stage("end")
        res.update(
            {
                "class": cls,
                "stage": st,
                "detail": detail,
                "seconds": round(time.time() - t0, 3),
                "times": stage.times,
            }
        )
        return res

    try:
        prog, inputs, R = _reference(source, workdir, stage, res)
    except _Invalid as e:
        return done("invalid", e.stage, e.detail)

    verdicts = run_optimize(prog, inputs, R, stage, res)  # (class, stage, detail)
    res["stages"]["optimize"] = ("%s@%s: %s" % verdicts[-1]) if verdicts else "ok"

    if os.environ.get("MEMSLIM_FUZZ_FX", "1") == "1":
        _leg("fx", lambda: run_fx(prog, inputs, R, res), res, stage, verdicts)

    if os.environ.get("MEMSLIM_FUZZ_COMPILE_BUDGET"):

        def budget_leg():
            b = os.environ["MEMSLIM_FUZZ_COMPILE_BUDGET"]
            return run_compile_budget(prog, inputs, R, None if b == "none" else float(b), res)

        _leg("compile-budget", budget_leg, res, stage, verdicts)

    if os.environ.get("MEMSLIM_FUZZ_COMPILE_PEAK"):
        frac = float(os.environ["MEMSLIM_FUZZ_COMPILE_PEAK"])
        _leg(
            "compile-peak",
            lambda: run_compile_peak(prog, inputs, R, frac, res),
            res,
            stage,
            verdicts,
        )

    if cli:
        _leg("cli", lambda: run_cli(prog, inputs, R, workdir, memslim_opt), res, stage, verdicts)
    return done(*_worst(verdicts))


# --------------------------------------------------------------------------
# Worker process
# --------------------------------------------------------------------------
def worker_main(argv):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--memslim-opt", default="")
    ap.add_argument("--no-cli", action="store_true")
    args = ap.parse_args(argv)
    fd = int(os.environ["FUZZ_RESULT_FD"])
    out = os.fdopen(fd, "w", buffering=1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, HERE)
    import gen

    def report(d):
        out.write(json.dumps(d) + "\n")
        out.flush()

    workdir = tempfile.mkdtemp(prefix="memslim-fuzz-")
    atexit.register(shutil.rmtree, workdir, True)
    report({"ready": os.getpid()})
    for line in sys.stdin:
        job = json.loads(line)
        report({"start": job["id"]})
        try:
            src = job.get("source") or gen.source(job["seed"])
            res = check_source(src, workdir, Stage(report), args.memslim_opt, cli=not args.no_cli)
        except Exception as e:  # a bug in the runner itself: never silently ok
            res = {
                "class": "runner-error",
                "stage": "",
                "detail": first_line(e) + " " + traceback.format_exc().splitlines()[-3][:200],
                "stages": {},
            }
        res["id"] = job["id"]
        report({"done": job["id"], "result": res})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_main(sys.argv[2:])
    else:
        print(
            "usage: runner.py worker [--memslim-opt PATH] [--no-cli]  (see fuzz.py)",
            file=sys.stderr,
        )
        sys.exit(2)
