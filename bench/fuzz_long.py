"""Differential program fuzzer, long mode (issue 9): >= 20,000 generated programs.

  .venv/bin/python bench/fuzz_long.py                       # seeds 100000:120000, 2 workers
  .venv/bin/python bench/fuzz_long.py --start 100000 --count 5000 --jobs 4
  .venv/bin/python bench/fuzz_long.py --report-only          # rewrite the table from the state file

Each program (test/fuzz/gen.py) runs eager, scripted, through memslim.optimize and through
memslim-opt --verify (test/fuzz/runner.py: stages, bars, classes, crash isolation). Results
are appended to a state file (JSONL, default bench/results/fuzz_long.state.jsonl, not
committed), so an interrupted run resumes where it stopped; bench/results/fuzz_long.md is
rewritten after every 200 programs and at the end: seed range, programs run, counts per
class and stage, memslim-opt's coverage and limitations, per-feature coverage, the measured
error distribution against the bars, and every finding (with --shrink: minimized into
bench/results/fuzz_long_findings/). The quick seeds (0:320) are the ctest's; the long range
starts at 100000 so the two never overlap.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "test", "fuzz"))

import runner  # noqa: E402

FAILING = ("wrong", "crash", "exception", "timeout", "runner-error")


def load_state(path: str) -> dict:
    done = {}
    if os.path.exists(path):
        for ln in open(path):
            ln = ln.strip()
            if ln:
                r = json.loads(ln)
                done[r["id"]] = r
    return done


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(results: list, args, wall: float, path: str):
    """Writes the run's Markdown table to path: header, classes, errors, features, findings."""
    valid = [r for r in results if r["class"] != "invalid"]
    out = (
        _report_header(results, args, wall)
        + _report_classes(results, valid)
        + _report_errors(results)
        + _report_features(valid)
        + _report_findings(results, args)
    )
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def _git_commit() -> str:
    try:
        commit = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = "?"
    return commit


def _report_header(results: list, args, wall: float) -> list:
    seeds = sorted(int(r["id"][5:]) for r in results)
    commit = _git_commit()
    import torch

    out = []
    w = out.append
    w("# Differential program fuzzer, long mode (`bench/fuzz_long.py`)")
    w("")
    w(
        "Generated %s on %s (%s), commit %s, torch %s; %d workers."
        % (
            datetime.date.today().isoformat(),
            platform.node() or "?",
            platform.machine(),
            commit,
            torch.__version__,
            args.jobs,
        )
    )
    w("")
    if seeds:
        w(
            "**Seeds %d..%d: %d programs run** (requested range %d:%d; %s)."
            % (
                seeds[0],
                seeds[-1],
                len(seeds),
                args.start,
                args.start + args.count,
                "complete"
                if len(seeds) >= args.count
                else "PARTIAL: %d of %d" % (len(seeds), args.count),
            )
        )
    w("Wall time of the last invocation: %.0f s." % wall)
    w("")
    return out


def _report_classes(results: list, valid: list) -> list:
    counts = collections.Counter(r["class"] for r in results)
    stages = collections.Counter(
        (r["class"], r.get("stage", "")) for r in results if r["class"] != "ok"
    )
    cli = collections.Counter()
    for r in valid:
        c = r.get("stages", {}).get("cli", "-")
        if c.startswith("limitation"):
            c = "limitation (%s archive)" % r.get("dtype", "?")
        else:
            c = c.split(":")[0]
        cli[c] += 1
    out = []
    w = out.append
    w("| class | programs |")
    w("|---|---:|")
    for cls in (
        "ok",
        "wrong",
        "crash",
        "exception",
        "timeout",
        "rng-order",
        "bf16-rounding",
        "fp32-rounding",
        "invalid",
        "runner-error",
    ):
        w("| %s | %d |" % (cls, counts.get(cls, 0)))
    w("")
    w(
        "`invalid`: eager, torch.jit.script or the scripted module failed (the generator's or "
        "TorchScript's fault; discarded). `rng-order`, `bf16-rounding`, `fp32-rounding`: reported, not failures "
        "(test/fuzz/runner.py). Not ok, by class and stage:"
    )
    w("")
    for (c, s), n in sorted(stages.items()):
        w("- %s @ %s: %d" % (c, s, n))
    w("")
    w(
        "memslim-opt stage (valid programs): "
        + ", ".join("%s: %d" % kv for kv in sorted(cli.items()))
    )
    w("")
    w(
        "Programs with at least one rewrite by memslim.optimize: %d of %d valid."
        % (sum(1 for r in valid if r.get("rewrites")), len(valid))
    )
    w("")
    return out


def _report_errors(results: list) -> list:
    out = []
    w = out.append
    w("## Error (relative L2, worst tensor per program; ok programs that draw no random numbers)")
    w("")
    w(
        "Scripted drift: the unmodified scripted module against eager (TorchScript's own difference; "
        "its tail is programs where TorchScript's semantics differ from eager's, e.g. an eval-mode "
        "dropout whose output is written in place). memslim.optimize: the smaller of its errors "
        "against eager and against the unmodified scripted module (the judge, test/fuzz/runner.py)."
    )
    w("")
    w(
        "| dtype | programs | scripted drift p50 / p99 / max | memslim.optimize p50 / p99 / max | bar |"
    )
    w("|---|---:|---|---|---:|")
    for dt in ("float32", "float64", "bfloat16"):
        rs = [
            r
            for r in results
            if r["class"] == "ok" and r.get("dtype") == dt and not r.get("random")
        ]
        d = [r.get("drift", 0.0) for r in rs]
        e = [r.get("opt_err", 0.0) for r in rs if "opt_err" in r]
        w(
            "| %s | %d | %.2g / %.2g / %.2g | %.2g / %.2g / %.2g | %.0e, up to %.0f x drift (at most %.0f x)%s |"
            % (
                dt,
                len(rs),
                pct(d, 0.5),
                pct(d, 0.99),
                max(d or [math.nan]),
                pct(e, 0.5),
                pct(e, 0.99),
                max(e or [math.nan]),
                runner.BARS[dt],
                runner.DRIFT_FACTOR,
                runner.DRIFT_CAP,
                "; or 4 x eager's error vs fp64" if dt == "bfloat16" else "",
            )
        )
    w("")
    return out


def _report_features(valid: list) -> list:
    feats = collections.Counter()
    feats_rew = collections.Counter()
    for r in valid:
        for f in r.get("feats", []):
            feats[f] += 1
            if r.get("rewrites"):
                feats_rew[f] += 1
    out = []
    w = out.append
    w("## Feature coverage (valid programs with the feature / of those, with >= 1 rewrite)")
    w("")
    w("| feature | programs | with rewrite |")
    w("|---|---:|---:|")
    for f, n in sorted(feats.items()):
        w("| `%s` | %d | %d |" % (f, n, feats_rew[f]))
    w("")
    return out


def _report_findings(results: list, args) -> list:
    out = []
    w = out.append
    w("## Findings")
    w("")
    bad = [
        r
        for r in results
        if r["class"] in FAILING + ("rng-order", "bf16-rounding", "fp32-rounding")
    ]
    if not bad:
        w("None.")
    by_sig = collections.defaultdict(list)
    for r in bad:
        by_sig[(r["class"], r.get("stage", ""), first_words(r.get("detail", "")))].append(r)
    for (c, s, words), rs in sorted(by_sig.items(), key=lambda kv: -len(kv[1])):
        w("### %s @ %s: %d programs" % (c, s, len(rs)))
        w("")
        w("`%s`" % words)
        w("")
        w("Seeds: " + ", ".join(r["id"][5:] for r in sorted(rs, key=lambda r: int(r["id"][5:]))))
        w("")
        for r in sorted(rs, key=lambda r: int(r["id"][5:]))[: args.detail_limit]:
            w("- %s: %s" % (r["id"][5:], r.get("detail", "").replace("|", "/")[:300]))
        w("")
    w(
        "Reproduce one: `python test/fuzz/fuzz.py show SEED > p.py && python test/fuzz/fuzz.py check p.py`; "
        "minimize: `python test/fuzz/fuzz.py shrink SEED`."
    )
    return out


def first_words(detail: str) -> str:
    import re

    d = re.sub(r"\[.*?\]|0x[0-9a-f]+|\d+(\.\d+)?(e-?\d+)?", "#", detail)
    d = re.sub(r"call #: (out|grad):\S+", r"call #: \1:*", d)
    return " ".join(d.split()[:12])


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--start", type=int, default=100000)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--state", default=os.path.join(HERE, "results", "fuzz_long.state.jsonl"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "fuzz_long.md"))
    ap.add_argument("--memslim-opt", default=runner.default_memslim_opt())
    ap.add_argument("--no-cli", action="store_true")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--detail-limit", type=int, default=20)
    ap.add_argument("--shrink", action="store_true", help="minimize every finding afterwards")
    args = ap.parse_args()

    ids = ["seed/%d" % s for s in range(args.start, args.start + args.count)]
    done = load_state(args.state)
    results = [done[i] for i in ids if i in done]
    t0 = time.time()
    if not args.report_only:
        todo = [{"id": i, "seed": int(i[5:])} for i in ids if i not in done]
        print(
            "fuzz_long: %d programs to run (%d already in %s)"
            % (len(todo), len(results), args.state),
            flush=True,
        )
        state = open(args.state, "a")

        def on_result(r):
            results.append(r)
            state.write(json.dumps(r) + "\n")
            state.flush()
            if r["class"] in FAILING:
                print(
                    "%s %s@%s %s"
                    % (r["id"], r["class"], r.get("stage", ""), r.get("detail", "")[:200]),
                    flush=True,
                )
            if len(results) % 200 == 0:
                report(results, args, time.time() - t0, args.out)
                print("... %d done, %.0f s" % (len(results), time.time() - t0), flush=True)

        runner.Pool(jobs=args.jobs, memslim_opt=args.memslim_opt, cli=not args.no_cli).run(
            todo, on_result
        )
        state.close()
    report(results, args, time.time() - t0, args.out)
    print("wrote %s (%d programs)" % (args.out, len(results)))
    if args.shrink:
        fdir = os.path.join(HERE, "results", "fuzz_long_findings")
        cmd = [
            sys.executable,
            os.path.join(REPO, "test", "fuzz", "fuzz.py"),
            "--jobs",
            str(args.jobs),
            "--memslim-opt",
            args.memslim_opt,
            "shrink-all",
            args.state,
            fdir,
        ]
        subprocess.run(cmd, check=False)


if __name__ == "__main__":
    main()
