"""Zoo run (issue 9): memslim.optimize over torchvision, transformers and timm models built from
configs, as a user would, checking that it never crashes, never refuses a valid input, never
keeps more bytes than the unmodified module, and keeps gradients as close to eager as the
unmodified module does.

  .venv/bin/python bench/zoo.py                  # every model of bench/_zoo_models.py (resumable)
  .venv/bin/python bench/zoo.py --quick          # 9 small models of every source
  .venv/bin/python bench/zoo.py --models timm/resmlp_12_224,torchvision/googlenet --rerun
  .venv/bin/python bench/zoo.py --render         # only rewrite bench/results/zoo.md

Per model, in its own subprocess (a signal is recorded, not fatal; the phase it died in says
whose crash it is): build (seed 0, dropout off, train mode), script it (trace where scripting
fails, as bench/_suite_models.script_or_trace), memslim.optimize(scripted, example_inputs),
then measure:
- saved-for-backward bytes (memslim.saved_bytes, 2 warm-up steps) of eager, of the unmodified
  scripted/traced module and of the optimized one; optimized > unmodified is a failure;
- the cost model's prediction (memslim.predicted_bytes_freed) against the measured difference;
- gradients of the input and every parameter after one forward/backward (calls 1 and 3 of the
  compiled modules: the profiling run and the optimized plan), as global relative L2 distance
  to eager fp32, and eager fp32's own distance to an fp64 eager run (the rounding noise floor).
Rows go to a JSON-lines cache (one line per finished model, appended under a lock, newest
wins), so a run resumes where it stopped and several drivers may share the cache (a model is
claimed by an O_EXCL file while it runs). The table: bench/results/zoo.md (verdicts and
rendering: bench/_zoo_report.py).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
RESULTS = os.path.join(HERE, "results")
DEFAULT_CACHE = os.path.join(RESULTS, "zoo.jsonl")
DEFAULT_MD = os.path.join(RESULTS, "zoo.md")

SKIP_FP64_PARAMS = 100e6  # no fp64 reference above this many parameters (memory, time)

from _zoo_report import FLAGS, render, verdict  # noqa: E402


# ---- worker (one model, its own process) ----------------------------------------------


def _outputs(out):
    """Tensors of a model's output (tensor, tuple/list/namedtuple, dict), floating only."""
    if hasattr(out, "_asdict"):
        out = tuple(out)
    if isinstance(out, dict):
        out = tuple(out.values())
    if isinstance(out, (tuple, list)):
        res = []
        for o in out:
            res += _outputs(o)
        return res
    if hasattr(out, "is_floating_point") and out.is_floating_point():
        return [out]
    return []


def _loss(out):
    """Mean square of every floating output (logits, hidden states, aux heads alike)."""
    outs = _outputs(out)
    loss = outs[0].double().square().mean()
    for o in outs[1:]:
        loss = loss + o.double().square().mean()
    return loss


def _grads(fn, module, inputs):
    """One forward/backward of fn(*inputs): {name: grad} of module's parameters + "input"."""

    params = dict(module.named_parameters())
    for p in params.values():
        p.grad = None
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    _loss(fn(*xs)).backward()
    g = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}
    for p in params.values():
        p.grad = None
    for i, x in enumerate(xs):
        if x.grad is not None:
            g[f"input{i}"] = x.grad.detach().clone()
    return g


def grad_dist(got, ref):
    """Global relative L2 distance ||G - G_ref|| / ||G_ref|| over every tensor of ref
    (a tensor missing from `got` counts in full), and the per-tensor worst (name, value).
    nan if ref is not finite."""
    import torch

    dsq, nsq, worst = 0.0, 0.0, ("", 0.0)
    for k, b in ref.items():
        b = b.double()
        if not torch.isfinite(b).all():
            return float("nan"), ("", float("nan"))
        a = got.get(k)
        d = b.norm().item() if a is None else (a.double() - b).norm().item()
        n = b.norm().item()
        dsq, nsq = dsq + d * d, nsq + n * n
        r = d / n if n > 0 else d
        if r > worst[1]:
            worst = (k, r)
    extra = [k for k in got if k not in ref]
    if extra:
        return float("inf"), (extra[0], float("inf"))
    return (dsq**0.5) / (nsq**0.5) if nsq > 0 else dsq**0.5, worst


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [""]
    errs = [ln for ln in lines if re.match(r"^[\w.:]+(Error|Exception): ", ln)]
    if errs and "TorchScript interpreter" in lines[0]:
        return errs[-1][:300]
    return f"{type(e).__name__}: {lines[0][:300]}"


def _summarize_records(res: dict, remarks) -> None:
    """Rewrites per pass, the rewrite records and the most common reasons to keep, into res."""
    per_pass, kept = {}, {}
    rewrote = []
    for d in remarks:  # decision records
        if d.verdict == "kept":
            why = re.sub(r"\d[\d,]*", "N", d.text)[:80]
            kept[why] = kept.get(why, 0) + 1
        elif d.verdict == "rewrote":
            per_pass[d.pass_] = per_pass.get(d.pass_, 0) + 1
            rewrote.append(str(d))
    res["rewrites"] = per_pass
    res["n_remarks"] = len(remarks)
    res["rewrote_remarks"] = rewrote[:300]
    res["kept_reasons"] = dict(sorted(kept.items(), key=lambda kv: -kv[1])[:15])


def worker(name: str, out_path: str, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    import memslim
    from _suite_models import script_or_trace
    from _zoo_models import registry

    spec = registry()[name]
    res = {
        "model": name,
        "source": spec.source,
        "shape": spec.shape,
        "phase": "import",
        "torch": torch.__version__,
        "threads": threads,
        "memslim_built": os.path.getmtime(memslim._C.__file__),
    }

    def save():
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f)
        os.replace(tmp, out_path)

    def phase(p):
        res["phase"] = p
        res.setdefault("phase_s", {})[p] = round(time.time() - t0, 1)
        save()  # what the driver reads if this process dies on a signal now

    t0 = time.time()
    try:
        phase("build")
        model = spec.build().train()
        inputs = spec.inputs()
        res["n_params"] = sum(p.numel() for p in model.parameters())

        phase("eager")
        ref = _grads(model, model, inputs)
        res["eager_saved"] = memslim.saved_bytes(model, *inputs, warmup=0)
        if res["n_params"] <= SKIP_FP64_PARAMS:
            phase("eager_fp64")
            try:
                m64 = copy.deepcopy(model).double()
                g64 = _grads(m64, m64, [x.double() if x.is_floating_point() else x for x in inputs])
                res["d_eager_fp64"] = grad_dist(ref, g64)[0]
                del m64, g64
            except Exception as e:  # some models build fp32-only tensors inside forward
                res["fp64_error"] = _one_line(e)

        phase("script")
        scripted, how = script_or_trace(model, inputs[0])
        res["how"] = how
        d, w = [], []
        for call in range(3):
            if call == 0 and how == "scripted":
                try:
                    g = _grads(scripted, scripted, inputs)
                except Exception as e:  # scripts, but does not run: trace instead
                    res["script_run_error"] = _one_line(e)
                    scripted = torch.jit.trace(model, tuple(inputs), check_trace=False)
                    res["how"] = how = (
                        f"traced (scripted module failed: {res['script_run_error'][:60]})"
                    )
                    g = _grads(scripted, scripted, inputs)
            else:
                g = _grads(scripted, scripted, inputs)
            if call in (0, 2):
                dist, worst = grad_dist(g, ref)
                d.append(dist)
                w.append(worst)
        res["d_script"] = [d[0], d[1]]
        res["d_script_worst"] = w[int(d[1] > d[0])]
        phase("script_saved")
        res["script_saved"] = memslim.saved_bytes(scripted, *inputs, warmup=2)

        phase("optimize")
        t = time.time()
        try:
            opt = memslim.optimize(scripted, example_inputs=tuple(x.detach() for x in inputs))
        except Exception as e:
            res["refused"] = _one_line(e)
            res["phase"] = "done"
            save()
            return
        res["optimize_s"] = round(time.time() - t, 2)
        remarks = memslim.report(opt)
        res["predicted"] = memslim.predicted_bytes_freed(opt)
        _summarize_records(res, remarks)

        phase("opt_grads")
        d, w = [], []
        for call in range(3):
            g = _grads(opt, opt, inputs)
            if call in (0, 2):
                dist, worst = grad_dist(g, ref)
                d.append(dist)
                w.append(worst)
        res["d_opt"] = [d[0], d[1]]
        res["d_opt_worst"] = w[int(d[1] > d[0])]
        phase("opt_saved")
        res["opt_saved"] = memslim.saved_bytes(opt, *inputs, warmup=2)
        res["phase"] = "done"
    except Exception as e:
        res["error"] = _one_line(e)
        res["traceback"] = traceback.format_exc()[-3000:]
    res["wall_s"] = round(time.time() - t0, 1)
    save()


# ---- driver -----------------------------------------------------------------------------


def load_cache(path: str) -> dict:
    rows = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        r = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    rows[r["model"]] = r
    return rows


def append_row(path: str, row: dict) -> None:
    with open(path + ".lock", "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        fcntl.flock(lk, fcntl.LOCK_UN)


def _claim(claims: str, name: str) -> bool:
    """O_EXCL claim file per model (pid inside), so that two drivers do not run one model; a
    claim of a dead process is taken over."""
    path = os.path.join(claims, name.replace("/", "__"))
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return True
        except FileExistsError:
            try:
                pid = int(open(path).read().strip() or "0")
                os.kill(pid, 0)
                return False  # alive
            except (ValueError, ProcessLookupError, FileNotFoundError):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
    return False


def _git_rev() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return rev + (" + uncommitted changes" if dirty else "")
    except OSError:
        return "unknown"


def run_one(name: str, a, tmpdir: str) -> dict:
    out = os.path.join(tmpdir, name.replace("/", "__") + ".json")
    log = os.path.join(tmpdir, name.replace("/", "__") + ".log")
    for p in (out,):
        if os.path.exists(p):
            os.unlink(p)
    env = dict(
        os.environ, OMP_NUM_THREADS=str(a.threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"
    )
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        name,
        "--worker-out",
        out,
        "--threads",
        str(a.threads),
    ]
    t = time.time()
    timeout = False
    with open(log, "w") as lf:
        p = subprocess.Popen(
            cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rc = p.wait(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
            timeout = True
    row = {"model": name, "phase": "start"}
    if os.path.exists(out):
        with open(out) as f:
            row = json.load(f)
    row["rc"] = rc
    row["wall_s"] = round(time.time() - t, 1)
    row["git"] = a.git
    row["date"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    if timeout:
        row["timeout"] = a.timeout
    elif rc < 0:
        row["signal"] = signal.Signals(-rc).name
        with open(log) as f:
            row["log_tail"] = f.read()[-2000:]
    elif rc != 0 and not row.get("error"):
        with open(log) as f:
            tail = f.read()[-2000:]
        row["error"] = f"worker exit {rc}: " + (tail.strip().splitlines() or [""])[-1][:300]
        row["log_tail"] = tail
    return row


def _parse_args():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models",
        default="",
        help="comma list: full or short names, a source ('timm/'), "
        "'heavy', 're:<regex>' (default: all)",
    )
    ap.add_argument("--exclude", default="", help="comma list to leave out, as --models")
    ap.add_argument("--quick", action="store_true", help="9 small models of every source")
    ap.add_argument("--rerun", action="store_true", help="run selected models again even if cached")
    ap.add_argument(
        "--rerun-failed", action="store_true", help="run again the cached rows with a flag"
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per model")
    ap.add_argument("--cache", default=DEFAULT_CACHE)
    ap.add_argument(
        "--md", default="", help="default: bench/results/zoo.md (quick: next to the cache)"
    )
    ap.add_argument("--render", action="store_true", help="only rewrite the table from the cache")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default="", help=argparse.SUPPRESS)
    return ap.parse_args()


def _select(spec: str, heavy: list):
    """A predicate over model names for a --models / --exclude list."""
    pats = [p.strip() for p in spec.split(",") if p.strip()]

    def one(p, n):
        if p == "heavy":
            return n in heavy
        if p.startswith("re:"):
            return re.search(p[3:], n) is not None
        if p.endswith("/"):
            return n.startswith(p)
        return p == n or p == n.split("/", 1)[1]

    return lambda n: any(one(p, n) for p in pats)


def _models(a):
    """(the models to run, the table's models): the registry (heavy ones last) or --quick's,
    narrowed by --models / --exclude. --quick moves the default cache next to it."""
    from _zoo_models import HEAVY, QUICK, registry

    reg = registry()
    names = [n for n in reg if n not in HEAVY] + HEAVY  # the table's order: heavy ones last
    if a.quick:
        names = QUICK
        if a.cache == DEFAULT_CACHE:
            a.cache = os.path.join(RESULTS, "zoo_quick.jsonl")
    table_names = list(names)
    if a.models:
        hit = _select(a.models, HEAVY)
        names = [n for n in names if hit(n)]
    if a.exclude:
        hit = _select(a.exclude, HEAVY)
        names = [n for n in names if not hit(n)]
    return names, table_names


def _meta(a) -> dict:
    """The run's header facts: date, revision, workers, command, CPU."""
    meta = dict(
        date=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        git=a.git,
        jobs=a.jobs,
        threads=a.threads,
        command="python bench/zoo.py " + " ".join(sys.argv[1:]),
    )
    try:
        meta["cpu"] = (
            next(
                ln.split(":", 1)[1].strip()
                for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")
            )
            + f", {os.cpu_count()} cores"
        )
    except (OSError, StopIteration):
        meta["cpu"] = "unknown CPU"
    return meta


def _run_models(a, names: list):
    """Runs the models not cached (or all with --rerun, the flagged ones with --rerun-failed)
    on a.jobs threads, each model claimed, run in its subprocess and appended to the cache."""
    rows = load_cache(a.cache)
    todo = []
    for n in names:
        r = rows.get(n)
        flagged = r is not None and any(verdict(r).get(k) for k in FLAGS)
        if a.rerun or r is None or (a.rerun_failed and flagged):
            todo.append(n)
    claims = a.cache + ".claims"
    os.makedirs(claims, exist_ok=True)
    tmpdir = a.cache + ".work"
    os.makedirs(tmpdir, exist_ok=True)
    print(f"{len(todo)} models to run ({len(names) - len(todo)} cached)", flush=True)

    def task(n):
        if not _claim(claims, n):
            print(f"skip {n}: claimed by another driver", flush=True)
            return
        try:
            row = run_one(n, a, tmpdir)
            append_row(a.cache, row)
            v = verdict(row)
            flags = [k for k, x in v.items() if x and k not in ("measured", "rewrote", "pred_ok")]
            print(
                f"{n}: {row.get('wall_s')} s, phase {row.get('phase')}, "
                f"unmod {row.get('script_saved')}, opt {row.get('opt_saved')}, "
                f"pred {row.get('predicted')} {' '.join(flags)} "
                f"{row.get('refused') or row.get('error') or row.get('signal') or ''}",
                flush=True,
            )
        finally:
            try:
                os.unlink(os.path.join(claims, n.replace("/", "__")))
            except FileNotFoundError:
                pass

    with ThreadPoolExecutor(max_workers=a.jobs) as ex:
        list(ex.map(task, todo))


def main():
    a = _parse_args()
    if a.worker:
        worker(a.worker, a.worker_out, a.threads)
        return
    names, table_names = _models(a)
    if a.list:
        print("\n".join(names))
        return
    md = a.md or (DEFAULT_MD if a.cache == DEFAULT_CACHE else os.path.splitext(a.cache)[0] + ".md")
    os.makedirs(os.path.dirname(os.path.abspath(a.cache)), exist_ok=True)
    a.git = _git_rev()
    meta = _meta(a)
    if not a.render:
        _run_models(a, names)
    rows = load_cache(a.cache)
    text = render(rows, table_names, md, meta)
    print("\n".join(ln for ln in text.splitlines() if ln.startswith("- ")))
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
