#!/usr/bin/env python3
"""memslim's differential program fuzzer: command line (issue 9).

  fuzz.py quick [--jobs 2]            the ctest: corpus/*.py + seeds QUICK_SEEDS; fails on
                                      any wrong / crash / exception / timeout not listed in
                                      known_failures.txt (listed ones run and are reported)
  fuzz.py run --seeds A:B [--out F]   a seed range, results appended to F (JSONL, resumable)
  fuzz.py check FILE.py [...]         programs from files (anything with make()), isolated
  fuzz.py show SEED                   print a generated program
  fuzz.py shrink SEED                 minimize a finding (keeps its class and stage)
  fuzz.py shrink-all RESULTS DIR      minimize the failures of a results file into DIR

Generator: gen.py; stages, bars and classes: runner.py; minimizer: shrink.py.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gen  # noqa: E402
import runner  # noqa: E402

QUICK_SEEDS = range(0, 340)
FAILING = (
    "wrong",
    "crash",
    "exception",
    "budget-miss",
    "peak-miss",
    "timeout",
    "runner-error",
)
REPORTED = FAILING + (
    "rng-order",
    "bf16-rounding",
    "fp32-rounding",
)  # printed; the last three do not fail the quick run


def parse_range(s: str) -> range:
    a, b = s.split(":")
    return range(int(a), int(b))


def load_known(path: str) -> dict:
    """known_failures.txt: `<seed or corpus file name>  <class>  # reason`, one a line."""
    known = {}
    if path and os.path.exists(path):
        for ln in open(path):
            ln = ln.split("#", 1)[0].strip()
            if ln:
                key, cls = ln.split()[:2]
                known[key] = cls
    return known


def corpus_jobs():
    return [
        {"id": "corpus/" + os.path.basename(p), "source": open(p).read()}
        for p in sorted(glob.glob(os.path.join(HERE, "corpus", "*.py")))
    ]


def summarize(results: list, out=sys.stdout):
    counts = collections.Counter(r["class"] for r in results)
    stages = collections.Counter(
        (r["class"], r.get("stage", "")) for r in results if r["class"] != "ok"
    )
    cli = collections.Counter(
        r.get("stages", {}).get("cli", "-").split(":")[0]
        for r in results
        if r["class"] != "invalid"
    )
    print(
        "programs: %d  %s"
        % (len(results), "  ".join("%s=%d" % kv for kv in sorted(counts.items()))),
        file=out,
    )
    print(
        "  by stage: " + ", ".join("%s@%s=%d" % (c, s, n) for (c, s), n in sorted(stages.items())),
        file=out,
    )
    print("  memslim-opt stage: " + ", ".join("%s=%d" % kv for kv in sorted(cli.items())), file=out)
    fx = collections.Counter(
        r.get("stages", {}).get("fx", "-").split(":")[0] for r in results if r["class"] != "invalid"
    )
    print(
        "  FX stage (torch.export + memslim.fx.optimize): "
        + ", ".join("%s=%d" % kv for kv in sorted(fx.items())),
        file=out,
    )
    rew = sum(1 for r in results if r.get("rewrites"))
    print("  programs with >= 1 rewrite by memslim.optimize: %d" % rew, file=out)
    rew = sum(1 for r in results if r.get("fx_rewrites"))
    print("  programs with >= 1 rewrite by memslim.fx.optimize: %d" % rew, file=out)
    return counts


def cmd_run(args):
    seeds = parse_range(args.seeds)
    done = {}
    if args.out and os.path.exists(args.out):
        for ln in open(args.out):
            r = json.loads(ln)
            done[r["id"]] = r
    jobs = [{"id": "seed/%d" % s, "seed": s} for s in seeds if "seed/%d" % s not in done]
    results = [done[k] for k in done if k.startswith("seed/") and int(k[5:]) in seeds]
    f = open(args.out, "a") if args.out else None
    t0 = time.time()

    def on_result(r):
        results.append(r)
        if f:
            f.write(json.dumps(r) + "\n")
            f.flush()
        if r["class"] in REPORTED or args.verbose:
            print(
                "%-14s %-9s %-14s %s"
                % (r["id"], r["class"], r.get("stage", ""), r.get("detail", "")[:300]),
                flush=True,
            )

    pool = runner.Pool(jobs=args.jobs, memslim_opt=args.memslim_opt, cli=not args.no_cli)
    pool.run(jobs, on_result)
    print("%d programs in %.1f s" % (len(jobs), time.time() - t0))
    summarize(results)


def cmd_quick(args):
    known = load_known(args.known)
    jobs = corpus_jobs() + [{"id": "seed/%d" % s, "seed": s} for s in QUICK_SEEDS]
    results = []
    t0 = time.time()
    pool = runner.Pool(jobs=args.jobs, memslim_opt=args.memslim_opt, cli=not args.no_cli)
    pool.run(jobs, results.append)
    wall = time.time() - t0
    if args.out:
        with open(args.out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    results.sort(
        key=lambda r: (
            r["id"].split("/")[0],
            int(r["id"].split("/")[1]) if r["id"].startswith("seed/") else 0,
            r["id"],
        )
    )
    new, known_hit, fixed = [], [], []
    for r in results:
        key = r["id"].split("/", 1)[1]
        if key in known:
            (known_hit if r["class"] in FAILING else fixed).append(r)
        elif r["class"] in FAILING:
            new.append(r)
    print(
        "quick fuzz: %d programs (%d corpus + seeds %d:%d), %.1f s wall, %d jobs"
        % (
            len(results),
            len(results) - len(QUICK_SEEDS),
            QUICK_SEEDS.start,
            QUICK_SEEDS.stop,
            wall,
            args.jobs,
        )
    )
    summarize(results)
    for r in known_hit:
        print(
            "known failure (known_failures.txt): %s %s@%s %s"
            % (r["id"], r["class"], r["stage"], r["detail"][:200])
        )
    for r in fixed:
        print(
            "NOTE: listed in known_failures.txt but now %s: %s (remove it from the list)"
            % (r["class"], r["id"])
        )
    for r in results:
        if (
            r["class"] in ("rng-order", "bf16-rounding", "fp32-rounding")
            and r["id"].split("/", 1)[1] not in known
        ):
            print("note (%s, not a failure): %s %s" % (r["class"], r["id"], r["detail"][:300]))
    for r in new:
        print("FAIL: %s %s@%s %s" % (r["id"], r["class"], r["stage"], r["detail"][:400]))
        if r["id"].startswith("seed/"):
            print(
                "      reproduce: python test/fuzz/fuzz.py show %s > p.py && python test/fuzz/fuzz.py check p.py"
                % r["id"][5:]
            )
    invalid = sum(1 for r in results if r["class"] == "invalid")
    if len(results) - invalid < 300:
        print("FAIL: only %d valid programs (need >= 300)" % (len(results) - invalid))
        return 1
    return 1 if new else 0


def cmd_check(args):
    jobs = [{"id": p, "source": open(p).read()} for p in args.files]
    results = []
    runner.Pool(
        jobs=min(args.jobs, len(jobs)), memslim_opt=args.memslim_opt, cli=not args.no_cli
    ).run(jobs, results.append)
    for r in results:
        print(
            json.dumps(r, indent=1)
            if args.verbose
            else "%s: %s %s %s" % (r["id"], r["class"], r.get("stage", ""), r.get("detail", ""))
        )
    return 1 if any(r["class"] in FAILING for r in results) else 0


def cmd_show(args):
    print(gen.source(int(args.seed)))


def cmd_shrink(args):
    import shrink

    if args.target.endswith(".py"):
        raise SystemExit("shrink takes a seed (files have no structure to edit)")
    prog, res = shrink.shrink_seed(
        int(args.target), jobs=1, memslim_opt=args.memslim_opt, cli=not args.no_cli, log=print
    )
    text = shrink.minimized_source(prog)
    if args.out:
        open(args.out, "w").write(text)
    print(text)
    print("# result: %s %s %s" % (res["class"], res.get("stage", ""), res.get("detail", "")))


def cmd_shrink_all(args):
    """Minimizes the failures in a results file: every wrong result and crash, and up
    to two programs per distinct exception signature; writes DIR/seed<N>.py."""
    import threading
    import shrink

    os.makedirs(args.outdir, exist_ok=True)
    todo, per_sig = [], collections.Counter()
    for ln in open(args.results):
        r = json.loads(ln)
        if r["class"] not in FAILING or not r["id"].startswith("seed/"):
            continue
        sig = shrink.signature(r)
        per_sig[sig] += 1
        if r["class"] in ("wrong", "crash", "timeout") or per_sig[sig] <= 2:
            todo.append(int(r["id"][5:]))
    todo = [
        s
        for s in sorted(set(todo))
        if not os.path.exists(os.path.join(args.outdir, "seed%d.py" % s))
    ]
    print("shrinking %d programs" % len(todo), flush=True)
    lock = threading.Lock()

    def work():
        while True:
            with lock:
                if not todo:
                    return
                seed = todo.pop(0)
            prog, res = shrink.shrink_seed(seed, memslim_opt=args.memslim_opt, cli=not args.no_cli)
            text = shrink.minimized_source(prog)
            head = "# minimized from seed %d: %s@%s: %s\n" % (
                seed,
                res["class"],
                res.get("stage", ""),
                res.get("detail", "").replace("\n", " ")[:300],
            )
            with open(os.path.join(args.outdir, "seed%d.py" % seed), "w") as f:
                f.write(head + text)
            with lock:
                print(
                    "seed %d: %s@%s %d lines"
                    % (seed, res["class"], res.get("stage", ""), len(text.splitlines())),
                    flush=True,
                )

    threads = [threading.Thread(target=work) for _ in range(args.jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--memslim-opt", default=runner.default_memslim_opt())
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-cli", action="store_true", help="skip the memslim-opt stage")
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quick")
    q.add_argument("--known", default=os.path.join(HERE, "known_failures.txt"))
    q.add_argument("--out", default="", help="also write the results (JSONL) here")
    r = sub.add_parser("run")
    r.add_argument("--seeds", required=True)
    r.add_argument("--out", default="")
    c = sub.add_parser("check")
    c.add_argument("files", nargs="+")
    s = sub.add_parser("show")
    s.add_argument("seed")
    k = sub.add_parser("shrink")
    k.add_argument("target")
    k.add_argument("--out", default="")
    ka = sub.add_parser("shrink-all")
    ka.add_argument("results")
    ka.add_argument("outdir")
    args = ap.parse_args(argv)
    return {
        "quick": cmd_quick,
        "run": cmd_run,
        "check": cmd_check,
        "show": cmd_show,
        "shrink": cmd_shrink,
        "shrink-all": cmd_shrink_all,
    }[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
