"""The GPU check (issue 47): memslim's CUDA half against aten, in one table.

What: runs, on the first CUDA device, (1) every public op's CUDA path against aten
(numerics at the CPU tests' bounds, NaN / inf / zero-size / non-contiguous inputs, saved
bytes and the peak), (2) torch.library.opcheck on the CUDA ops, (3) op speed against aten
(fwd + bwd, 16M elements, CUDA events), (4) a training step of three suite models through
eager, torch.compile, torch.compile(backend="memslim") and memslim.compile; prints one
table and writes it (with the date, commit, torch, device and plan) to --out, by default
$OUT/gpu_check.md when $OUT is set. Each check is isolated: a failure is a row, never
the end of the run. With --dry-run, or when no GPU is found, every GPU step is listed as
skipped with its estimated time, and parts 1-3 run on the CPU at small sizes (the same
code), so that the check cannot rot; part 4 joins them with --smoke-models.
scripts/gpu_check.sh builds what the GPU needs and calls this. Exit: 0 when no row
failed, 1 when one did, 2 on bad arguments.
Why: a GPU is lent for minutes now and then; the check must be ready and known to run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from _gpu_check_common import FAIL, INFO, OK, PLAN, SKIP, Row, first_line, torch_version  # noqa: E402

PARTS = ("1", "2", "3", "4")


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="no GPU steps: list them, run the rest")
    ap.add_argument(
        "--parts",
        default="1,2,3,4",
        help="comma-separated parts (1 ops, 2 opcheck, 3 speed, 4 models)",
    )
    ap.add_argument(
        "--out", default="", help="results file (default: $OUT/gpu_check.md when $OUT is set)"
    )
    ap.add_argument("--smoke-models", action="store_true", help="dry run: part 4 on the CPU, small")
    ap.add_argument(
        "--budget-s", type=float, default=240.0, help="the checks' time budget (part 4 stops at it)"
    )
    ap.add_argument(
        "--build", default="", help="the build's row (scripts/gpu_check.sh): status;seconds;text"
    )
    ap.add_argument("--verbose", action="store_true", help="tracebacks of failing checks")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.exit(2, f"gpu_check: unknown part {bad[0]!r} (parts are 1, 2, 3, 4)\n")
    args.parts = parts
    if not args.out and os.environ.get("OUT"):
        args.out = os.path.join(os.environ["OUT"], "gpu_check.md")
    return args


def _commit() -> str:
    env = os.environ.get("GPU_CHECK_COMMIT")
    if env:
        return env
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        if out.returncode == 0:
            return out.stdout.strip()
    except OSError:
        pass
    return "unknown (no .git: set GPU_CHECK_COMMIT)"


def _environment(rows, device):
    name = torch.cuda.get_device_name(0) if device == "cuda" else "none (CPU)"
    rows.append(
        Row("env", "torch", INFO, f"{torch.__version__}, CUDA {torch.version.cuda}", "", None)
    )
    rows.append(Row("env", "device", INFO, name, "", None))
    if torch_version() < (2, 14):
        rows.append(
            Row(
                "env", "torch < 2.14", INFO, "ways that need 2.14's internals report skip", "", None
            )
        )


def _import_memslim(rows):
    t0 = time.perf_counter()
    try:
        import memslim

        n = len(memslim.OPS)
        rows.append(
            Row(
                "env",
                "import memslim",
                OK,
                f"{n} public activation ops; {memslim.library_path()}",
                "",
                time.perf_counter() - t0,
            )
        )
        return True
    except Exception as e:  # noqa: BLE001
        rows.append(Row("env", "import memslim", FAIL, first_line(e), "", time.perf_counter() - t0))
        return False


def _build_row(rows, spec):
    if not spec:
        return
    status, secs, text = (spec.split(";", 2) + ["", ""])[:3]
    rows.append(
        Row("build", "cmake + ninja", status, text, "<= 240 s", float(secs) if secs else None)
    )


def _run_parts(rows, args, device, small, report):
    """Runs the parts in order; after each, prints its count and any row not ok and calls
    report() (the results file so far: a run cut short still leaves its rows)."""
    from _gpu_check_models import part_models
    from _gpu_check_opcheck_speed import part_opcheck, part_speed
    from _gpu_check_ops import part_activations, part_others

    # The budget is the GPU's; the CPU smoke of part 4 compiles for minutes on 2 cores.
    deadline = time.monotonic() + (args.budget_s if not small else 3600.0)
    steps = {
        "1": [part_activations, part_others],
        "2": [part_opcheck],
        "3": [part_speed],
    }
    for part in args.parts:
        if part == "4":
            if small and not args.smoke_models:
                continue
            fns = [lambda r, d, s: part_models(r, d, s, deadline)]
        else:
            fns = steps[part]
        for fn in fns:
            n0, t0 = len(rows), time.perf_counter()
            try:
                fn(rows, device, small)
            except Exception as e:  # noqa: BLE001  (a part's own set-up failing is a row too)
                rows.append(Row(part, fn.__name__, FAIL, first_line(e), "", None))
            new = rows[n0:]
            bad = [r for r in new if r.status not in (OK, INFO)]
            print(
                f"gpu_check: part {part} ({fn.__name__}): {len(new)} rows, {len(bad)} not ok, "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            for r in bad:
                print(f"  {r.status}: {r.name}: {r.value}", flush=True)
            report(final=False)


def _plan_lines(dry: bool, parts):
    lines = ["Plan (estimated seconds on one H200, 16 cores):"]
    total = 0
    for step, what, secs in PLAN:
        if step != "build" and step.split()[0] not in parts:
            continue
        total += secs
        lines.append(f"  {step:<10} {secs:>4} s  {what}{'  [skipped: dry run]' if dry else ''}")
    lines.append(f"  total      {total:>4} s  (build <= 240 s cold, checks <= 240 s)")
    return lines


def render(rows) -> str:
    cols = ["part", "check", "status", "measured", "bound", "s"]
    body = [
        [r.part, r.name, r.status, r.value, r.bound, "" if r.secs is None else f"{r.secs:.1f}"]
        for r in rows
    ]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in b) + " |" for b in body]
    return "\n".join(out)


def main(argv=None) -> int:
    args = _args(argv if argv is not None else sys.argv[1:])
    has_gpu = torch.cuda.is_available()
    dry = args.dry_run or not has_gpu
    device = "cpu" if dry else "cuda"
    t0 = time.perf_counter()
    rows = []
    _environment(rows, device)
    _build_row(rows, args.build)
    if dry:
        why = "dry run" if args.dry_run else "no GPU found"
        for step, what, secs in PLAN:
            if step == "build" or step.split()[0] in args.parts:
                rows.append(
                    Row(step, what, SKIP, f"GPU step ({why}); ~{secs} s on the GPU", "", None)
                )
    plan = _plan_lines(dry, args.parts)
    print("\n".join(plan), flush=True)

    def report(final=True):
        table = render(rows)
        counts = {s: sum(r.status == s for r in rows) for s in (OK, FAIL, "warn", SKIP)}
        summary = (
            f"gpu_check: {'dry run' if dry else 'GPU run'}, {len(rows)} rows: "
            + ", ".join(f"{v} {k}" for k, v in counts.items())
            + f"; {time.perf_counter() - t0:.0f} s"
            + ("" if final else " (so far)")
        )
        if final:
            print(table + "\n\n" + summary, flush=True)
        if args.out:
            head = (
                f"# memslim GPU check ({'dry run' if dry else 'GPU run'})\n\n"
                f"{datetime.date.today()}, commit {_commit()}, torch {torch.__version__}, "
                f"{platform.node() or 'host'}, {os.cpu_count()} cores; command: "
                f"`{' '.join(['bench/gpu_check.py'] + (argv or sys.argv[1:]))}`\n\n"
            )
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            text = head + "```\n" + "\n".join(plan) + "\n```\n\n" + table + "\n\n" + summary
            Path(args.out).write_text(text + "\n")
            if final:
                print(f"gpu_check: wrote {args.out}")

    if _import_memslim(rows):
        _run_parts(rows, args, device, small=dry, report=report)
    if dry:
        for r in rows:
            if r.part[:1].isdigit() and r.status != SKIP and r.secs is not None:
                r.part += " (cpu)"
    report()
    n_fail = sum(r.status == FAIL for r in rows)
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
