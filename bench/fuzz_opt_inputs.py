"""Fuzzes memslim-opt's readers: mutated IR text and corrupted TorchScript archives.

What: IR inputs are the `# -----` cases (and split-file parts) of lit-tests/*.ir,
mutated 1-3 times each (line drops/duplicates/swaps, token swaps, op, type, shape,
constant and name changes, indentation, truncation, random bytes). Archive inputs
are small scripted modules (MLP with an exported method, Conv-BN-ReLU, bool/float
arguments with dropout, tuple output with a loop, print + attribute write) saved
with torch.jit.save, then byte flips, truncation, zip entries removed, renamed or
duplicated, and entry contents mutated (code, pickles, tensor data) in a valid zip.
Each input runs memslim-opt with random flags (pipeline or passes, --input-shapes
from the signature or random, --verify, --split-input-file, -o, policy values).
Why: memslim-opt promises one `memslim-opt: error:` line, exit 1 and no output
file for every failure; this checks it, and that every success's output reads back
(memslim-opt on its own output). Findings: any signal, an exit code other than 0/1,
an error that is not exactly one line (the last of stderr), an output file left on
error, an "internal error" (the terminate handler), torch's INTERNAL ASSERT text,
an output that does not read back, a timeout.

Usage: bench/fuzz_opt_inputs.py [--count N] [--seed S] [--jobs J] [--out FILE]
       bench/fuzz_opt_inputs.py --quick      (300 inputs, the ctest)
Each run is limited to 3 GiB of address space (RLIMIT_AS), so a mutated shape
fails as an allocation error instead of pushing a shared machine into swap.

The mutations: bench/_fuzz_opt_ir.py (the lit cases and IR text mutations) and
bench/_fuzz_opt_archives.py (archive corruptions); this file holds the flags, the scripted
modules the archives start from (kept in the script: their TorchScript names, which the
archives' code entries carry, stay those of `__main__`), and runs and checks memslim-opt.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import io
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _fuzz_opt_archives import PT_MUTATORS  # noqa: E402
from _fuzz_opt_ir import IR_MUTATORS, _tokens, lit_cases, signature_specs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OPT = os.environ.get("MEMSLIM_OPT", str(ROOT / "build" / "bin" / "memslim-opt"))
TIMEOUT_S = 120
COMMIT_NOTE = os.environ.get("FUZZ_COMMIT_NOTE", "the memslim-opt binary built from it")
START_COMMIT = subprocess.run(
    ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
).stdout.strip()
MEM_LIMIT = 3 << 30

# ----------------------------------------------------------------------------
# Flags


def random_specs(rng) -> str:
    def one():
        r = rng.random()
        if r < 0.5:
            return "x".join(
                str(rng.choice([0, 1, 2, 4, 8, 16, 33])) for _ in range(rng.randint(1, 4))
            )
        if r < 0.6:
            return rng.choice(["100000x100000x100000", "4000000000", "30000x30000", "1x0x5"])
        return rng.choice(["0.5", "1", "true", "false", "none", "scalar", "-3", "1e400", "nan"])

    return ",".join(one() for _ in range(rng.randint(1, 4)))


def policy_flags(rng) -> List[str]:
    out = []
    for flag, values in [
        ("--min-bytes", ["0", "1", "1000", "-1", "1.5", "x", "99999999999999999999"]),
        ("--max-added-work", ["0", "1", "2.5", "inf", "nan", "-1"]),
        ("--assume-numel", ["0", "4096", "1099511627776", "1099511627777", "-5"]),
        ("--dropout-mask-bytes", ["0", "1", "7", ""]),
    ]:
        if rng.random() < 0.08:
            out.append(f"{flag}={rng.choice(values)}")
    return out


def pass_flags(rng, passes: List[str]) -> List[str]:
    r = rng.random()
    if r < 0.6:
        return ["--pipeline=memslim-default"]
    if r < 0.95:
        return ["--passes=" + ",".join(rng.sample(passes, rng.randint(1, len(passes))))]
    return []


# ----------------------------------------------------------------------------
# Archive corpus: the scripted modules the archive inputs start from (their corruptions:
# _fuzz_opt_archives.py)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 16)

    def forward(self, x):
        h = self.b(F.gelu(self.a(x)))
        return h * torch.sigmoid(h)

    @torch.jit.export
    def features(self, x):
        return F.gelu(self.a(x))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.bn(self.c(x))).mean((2, 3))


class Flags(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)

    def forward(self, x, train: bool, p: float):
        return F.dropout(F.silu(self.a(x)), p, train)


class Loop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)

    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor]:
        y = x
        for _ in range(2):
            y = torch.tanh(self.a(y))
        return y, F.gelu(x)


class Printer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        print("calls", self.calls)
        return F.gelu(self.a(x))


ARCHIVES = [
    ("MLP", "8x16"),
    ("CNN", "2x3x8x8"),
    ("Flags", "8x16,true,0.5"),
    ("Loop", "8x16"),
    ("Printer", "8x16"),
]


def make_archives() -> Dict[str, bytes]:
    import warnings

    warnings.filterwarnings("ignore")
    out = {}
    for name, _ in ARCHIVES:
        torch.manual_seed(0)
        buf = io.BytesIO()
        torch.jit.save(torch.jit.script(globals()[name]()), buf)
        out[name] = buf.getvalue()
    return out


# ----------------------------------------------------------------------------
# Running and checking


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


SLOW: List[Tuple[float, str]] = []


def run_opt(args: List[str], stdin: Optional[bytes] = None):
    t = time.time()
    try:
        p = subprocess.run(
            [OPT] + args,
            input=stdin if stdin is not None else b"",
            capture_output=True,
            timeout=TIMEOUT_S,
            preexec_fn=_limit,
        )
        res = p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        res = None, b"", ""
    SLOW.append((time.time() - t, " ".join(args)[-200:]))
    return res


def check(rc, stdout: bytes, stderr: str, flags: List[str], out_path: Optional[Path]) -> List[str]:
    """The findings for one run (empty: it kept every promise)."""
    f = []
    if rc is None:
        return ["timeout"]
    if rc < 0:
        return [f"signal {-rc}"]
    if rc not in (0, 1):
        return [f"exit code {rc}"]
    lines = stderr.splitlines()
    errors = [ln for ln in lines if ln.startswith("memslim-opt: error:")]
    printing = "--print-ir-after-all" in flags
    if rc == 1:
        if len(errors) != 1 or not lines or lines[-1] != errors[0]:
            f.append("not exactly one error line, last")
        elif not printing:
            extra = [
                ln
                for ln in lines[:-1]
                if not (
                    ln.startswith("remark: ")
                    or ln.startswith("memslim-opt: verify: ok")
                    or ln.startswith("memslim-opt: warning: ")
                )
            ]
            if extra:
                f.append("other stderr lines before the error")
        if errors and "internal error" in errors[0]:
            f.append("internal error (terminate handler)")
        if "INTERNAL ASSERT" in stderr or "report a bug to PyTorch" in stderr:
            f.append("torch INTERNAL ASSERT text")
        if out_path is not None and (out_path.exists() or Path(str(out_path) + ".tmp").exists()):
            f.append("output file left on error")
    else:
        if errors:
            f.append("error line with exit 0")
        if out_path is not None and not out_path.exists():
            f.append("exit 0 without the output file")
    return f


def error_kind(stderr: str) -> str:
    """The error line with numbers, names and quoted text folded, for the tally."""
    line = next((ln for ln in stderr.splitlines() if ln.startswith("memslim-opt: error:")), "")
    line = line[len("memslim-opt: error: ") :]
    line = re.sub(r"'[^']*'", "'…'", line)
    line = re.sub(r"%[\w.]+", "%v", line)
    line = re.sub(r"\d+", "N", line)
    return line[:90]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.n = 0
        self.by_kind = collections.Counter()
        self.ok = collections.Counter()
        self.err = collections.Counter()
        self.error_kinds = collections.Counter()
        self.findings: List[dict] = []
        self.round_trips = 0
        self.verify_ok = 0


def one_case(
    i: int, seed: int, cases, pool, passes, archives, work: Path, stats: Stats, keep: Path
):
    rng = random.Random(seed * 1_000_003 + i)
    d = work / f"c{i}"
    d.mkdir()
    out_path = None
    if rng.random() < 0.75:  # IR text
        name, text = cases[rng.randrange(len(cases))]
        muts = [rng.choice(list(IR_MUTATORS)) for _ in range(rng.randint(1, 3))]
        data = text
        for m in muts:
            data = IR_MUTATORS[m](
                rng, data if isinstance(data, str) else data.decode("utf-8", "replace"), pool
            )
        raw = data if isinstance(data, bytes) else data.encode()
        kind = "ir:" + "+".join(muts)
        src = d / "in.ir"
        src.write_bytes(raw)
        flags = pass_flags(rng, passes)
        if rng.random() < 0.3:
            flags.append("--split-input-file")
        r = rng.random()
        text_now = raw.decode("utf-8", "replace")
        if r < 0.45:
            spec = signature_specs(text_now, rng)
            if spec:
                flags.append("--input-shapes=" + spec)
        elif r < 0.6:
            flags.append("--input-shapes=" + random_specs(rng))
        use_stdin = rng.random() < 0.1
        args = ["-" if use_stdin else str(src)]
        origin = name
    else:  # archive
        name, spec = ARCHIVES[rng.randrange(len(ARCHIVES))]
        mut = rng.choice(list(PT_MUTATORS))
        raw = PT_MUTATORS[mut](rng, archives[name])
        if rng.random() < 0.5:
            raw = PT_MUTATORS[rng.choice(list(PT_MUTATORS))](rng, raw) if raw[:2] == b"PK" else raw
        kind = "pt:" + mut
        src = d / "in.pt"
        src.write_bytes(raw)
        flags = pass_flags(rng, passes)
        r = rng.random()
        if r < 0.6:
            flags.append("--input-shapes=" + spec)
        elif r < 0.75:
            flags.append("--input-shapes=" + random_specs(rng))
        use_stdin = False
        args = [str(src)]
        origin = name
    if rng.random() < 0.4:
        flags.append("--verify")
    if rng.random() < 0.5:
        flags.append("--remarks")
    if rng.random() < 0.03:
        flags.append("--print-ir-after-all")
    flags += policy_flags(rng)
    if rng.random() < 0.5:
        out_path = d / ("out.pt" if kind.startswith("pt:") else "out.ir")
        flags += ["-o", str(out_path)]
    rc, stdout, stderr = run_opt(args + flags, raw if use_stdin else None)
    findings = check(rc, stdout, stderr, flags, out_path)
    # A success's output reads back: memslim-opt on its own output.
    if rc == 0 and not findings:
        # With the run's own --input-shapes: they override the signature's types, which
        # the output keeps as they were (a mutated stride of 2^31 is refused without them).
        back_flags = (
            ["--passes=cleanup"]
            + (["--split-input-file"] if "--split-input-file" in flags else [])
            + [f for f in args + flags if f.startswith("--input-shapes=")]
        )
        if kind.startswith("ir:"):
            produced = out_path.read_bytes() if out_path else stdout
            p2 = d / "back.ir"
            p2.write_bytes(produced)
            rc2, _, err2 = run_opt([str(p2)] + back_flags)
            if rc2 != 0:
                findings.append("output does not read back: " + error_kind(err2))
        elif out_path is not None:
            rc2, _, err2 = run_opt([str(out_path)] + back_flags)
            if rc2 != 0:
                findings.append("written archive does not load back: " + error_kind(err2))
        with stats.lock:
            stats.round_trips += 1
            stats.verify_ok += "--verify" in flags
    with stats.lock:
        stats.n += 1
        stats.by_kind[kind.split(":")[0] + ":" + kind.split(":")[1].split("+")[0]] += 1
        (stats.ok if rc == 0 else stats.err)[kind.split(":")[0]] += 1
        if rc == 1:
            stats.error_kinds[error_kind(stderr)] += 1
        if findings:
            keep.mkdir(parents=True, exist_ok=True)
            saved = keep / f"{seed}-{i}{src.suffix}"
            saved.write_bytes(raw)
            stats.findings.append(
                {
                    "i": i,
                    "kind": kind,
                    "origin": origin,
                    "findings": findings,
                    "args": " ".join(
                        [saved.name if a == str(src) else a for a in args]
                        + [("OUT" if a == str(out_path) else a) for a in flags]
                    ),
                    "rc": rc,
                    "stderr": stderr[-600:],
                }
            )
    shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="300 inputs, no report file (the ctest)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fuzz_opt_inputs.md"))
    a = ap.parse_args()
    if a.quick:
        a.count = 300
    cases = lit_cases()
    pool = sorted({text[s:e] for _, text in cases for s, e in _tokens(text)})
    listed = subprocess.run(
        [OPT, "--list-passes"], capture_output=True, text=True, check=True
    ).stdout
    passes = [
        ln.split()[0]
        for ln in listed.splitlines()
        if ln.strip() and not ln.strip().startswith("pipeline")
    ]
    archives = make_archives()
    stats = Stats()
    # Inputs that broke a promise are kept for their repro (quick mode: outside the tree).
    keep = (
        Path(tempfile.mkdtemp(prefix="fuzz_opt_findings_"))
        if a.quick
        else ROOT / "bench" / "results" / "fuzz_opt_inputs_findings"
    )
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="fuzz_opt_") as tmp:
        work = Path(tmp)
        with ThreadPoolExecutor(max_workers=a.jobs) as pool_ex:
            futs = [
                pool_ex.submit(
                    one_case, i, a.seed, cases, pool, passes, archives, work, stats, keep
                )
                for i in range(a.count)
            ]
            gen_errors = 0
            for k, fu in enumerate(futs):
                try:
                    fu.result()
                except (
                    Exception
                ) as e:  # the fuzzer's own bug (a mutator on empty input): not memslim's
                    gen_errors += 1
                    print(
                        f"input {k}: the fuzzer itself failed: {type(e).__name__}: {e}",
                        file=sys.stderr,
                        flush=True,
                    )
                if (k + 1) % 250 == 0:
                    print(
                        f"{k + 1}/{a.count} inputs, {len(stats.findings)} findings, "
                        f"{time.time() - t0:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    elapsed = time.time() - t0
    if gen_errors:
        print(
            f"{gen_errors} inputs not run: the fuzzer's own mutators failed on them",
            file=sys.stderr,
        )
    kinds = collections.Counter(f for rec in stats.findings for f in rec["findings"])
    summary = (
        f"{stats.n} inputs (seed {a.seed}; {sum(v for k, v in stats.by_kind.items() if k.startswith('ir'))} IR, "
        f"{sum(v for k, v in stats.by_kind.items() if k.startswith('pt'))} archives) in {elapsed:.0f} s: "
        f"exit 0: {sum(stats.ok.values())}, exit 1: {sum(stats.err.values())}, "
        f"findings: {len(stats.findings)}"
    )
    print(summary)
    for t, args in sorted(SLOW, reverse=True)[:5]:
        print(f"  slowest: {t:.1f} s  {args}")
    for k, v in kinds.most_common():
        print(f"  {v:5d}  {k}")
    for rec in stats.findings[:20]:
        print(
            f"  #{rec['i']} {rec['kind']} ({rec['origin']}): {rec['findings']} rc={rec['rc']}\n"
            f"      memslim-opt {rec['args']}\n      {rec['stderr'].strip()[-300:]}"
        )
    if stats.findings:
        print(f"inputs of the findings: {keep}")
    if not a.quick:
        write_report(Path(a.out), a, stats, kinds, elapsed, len(cases), summary)
    sys.exit(1 if stats.findings else 0)


def write_report(path: Path, a, stats: Stats, kinds, elapsed, ncases, summary):
    L = [
        "# memslim-opt input fuzzing (`bench/fuzz_opt_inputs.py`)",
        "",
        f"Run {datetime.date.today().isoformat()} at commit {START_COMMIT} ({COMMIT_NOTE}): "
        f"`bench/fuzz_opt_inputs.py --count {a.count} --seed {a.seed} "
        f"--jobs {a.jobs}`, torch {torch.__version__}, {ncases} lit cases and {len(ARCHIVES)} scripted "
        f"modules as seeds, each run under a {MEM_LIMIT >> 30} GiB address-space limit, {TIMEOUT_S} s timeout.",
        "",
        f"**{summary}.**",
        "",
        "Checked per run: no signal, exit code 0 or 1, on exit 1 exactly one `memslim-opt: error:` line and "
        "it is the last stderr line (only remarks, `verify: ok` and one-line warnings before it), no output file (nor `.tmp`) "
        "left, no `internal error` (terminate handler) and no torch `INTERNAL ASSERT` text; on exit 0 the "
        "output (stdout or `-o`) is read back by memslim-opt (`--passes=cleanup`).",
        "",
        "| finding | runs |",
        "|---|---:|",
    ]
    L += [f"| {k} | {v} |" for k, v in kinds.most_common()] or ["| (none) | 0 |"]
    L += [
        "",
        f"Successful runs read back: {stats.round_trips} (of which with `--verify`: {stats.verify_ok}).",
        "",
        "## Inputs by first mutation",
        "",
        "| mutation | runs |",
        "|---|---:|",
    ]
    L += [f"| `{k}` | {v} |" for k, v in sorted(stats.by_kind.items())]
    L += [
        "",
        "## Most frequent error lines (numbers and names folded)",
        "",
        "| error | runs |",
        "|---|---:|",
    ]
    L += [f"| `{k.replace('|', '/')}` | {v} |" for k, v in stats.error_kinds.most_common(40)]
    if stats.findings:
        L += ["", "## Findings", ""]
        for rec in stats.findings:
            L += [
                f"- #{rec['i']} `{rec['kind']}` from {rec['origin']}: {', '.join(rec['findings'])} (rc {rec['rc']}); "
                f"`memslim-opt {rec['args']}`; stderr tail: `{rec['stderr'].strip()[-200:]}`"
            ]
    path.write_text("\n".join(L) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
