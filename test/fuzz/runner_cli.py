"""The fuzz judge's memslim-opt leg: the scripted archive through `memslim-opt --verify`.

What: `MemslimOpt` (runs memslim-opt through one `--fork-server` per worker),
`run_cli` (the `cli` stage: torch.jit.save of the scripted module, memslim-opt --verify,
its output archive judged against eager) and `default_memslim_opt` (the binary: $MEMSLIM_OPT
or the checkout's build/bin/memslim-opt).
Why: one module per stage of runner.py's judge; its shared helpers are runner_common.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Dict, List, Optional


from runner_common import (
    REPO,
    Reference,
    call,
    compare,
    first_line,
    fp64_twin_same,
    trainable,
)


class MemslimOpt:
    """Runs memslim-opt like subprocess.run(..., capture_output=True, text=True,
    timeout=T), through one `memslim-opt --fork-server` per worker: a process start
    costs ~0.4 s of torch's static initialisers, most of a run's time; the server
    forks a fresh memslim-opt per call (tools/memslim-opt/fork_server.cpp).
    MEMSLIM_OPT_SPAWN=1 starts a new process per call instead. A server that dies
    is restarted; the call it was serving is reported as a crash (signal)."""

    def __init__(self, binary: str, workdir: str):
        self.binary, self.workdir = binary, workdir
        self.spawn = os.environ.get("MEMSLIM_OPT_SPAWN", "") == "1"
        self.proc: Optional[subprocess.Popen] = None

    def _server(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            # one thread, as the worker itself runs (torch.set_num_threads(1))
            env = dict(os.environ, OMP_NUM_THREADS="1")
            self.proc = subprocess.Popen(
                [self.binary, "--fork-server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                env=env,
            )
        return self.proc

    def run(self, argv: List[str], timeout: int) -> subprocess.CompletedProcess:
        if self.spawn:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        assert argv[0] == self.binary
        outp, errp = os.path.join(self.workdir, "cli.out"), os.path.join(self.workdir, "cli.err")
        fields = [outp, errp, str(int(timeout))] + list(argv[1:])
        if any("\x1f" in f or "\n" in f for f in fields):
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        srv = self._server()
        try:
            srv.stdin.write("\x1f".join(fields) + "\n")
            srv.stdin.flush()
            reply = srv.stdout.readline()
        except (BrokenPipeError, OSError):
            reply = ""
        if not reply.strip().lstrip("-").isdigit():
            self.close()
            raise RuntimeError("memslim-opt --fork-server failed (reply %r)" % reply[:80])
        code = os.waitstatus_to_exitcode(int(reply))
        if code == -signal.SIGALRM:
            raise subprocess.TimeoutExpired(argv, timeout)

        def text(path):
            with open(path, "rb") as f:
                return f.read().decode("utf-8", "replace")

        return subprocess.CompletedProcess(argv, code, text(outp), text(errp))

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
            self.proc = None


_CLI: Dict[str, MemslimOpt] = {}


def memslim_opt_runner(binary: str, workdir: str) -> MemslimOpt:
    key = binary + "\0" + workdir
    if key not in _CLI:
        _CLI[key] = MemslimOpt(binary, workdir)
    return _CLI[key]


def run_cli(prog, inputs, R: Reference, workdir, memslim_opt):
    import torch

    dtype = R.dtype

    if not memslim_opt or not os.path.exists(memslim_opt):
        return ("limitation", "cli", "memslim-opt binary not found")
    if dtype != "float32":
        return (
            "limitation",
            "cli",
            "%s program: --input-shapes makes fp32 tensors for an archive's "
            "untyped Tensor inputs" % dtype,
        )
    tokens = []
    for a in inputs:
        if isinstance(a, torch.Tensor):
            tokens.append("x".join(map(str, a.shape)) if a.dim() else "scalar")
        elif isinstance(a, bool):
            tokens.append("true" if a else "false")
        elif isinstance(a, (int, float)):
            tokens.append(repr(a))
        else:
            return (
                "limitation",
                "cli",
                "a %s forward argument has no --input-shapes form" % type(a).__name__,
            )
    src = os.path.join(workdir, "in.pt")
    out = os.path.join(workdir, "out.pt")
    for p in (src, out):
        if os.path.exists(p):
            os.remove(p)
    torch.jit.save(torch.jit.script(prog.make()[0]), src)
    shapes = ",".join(tokens)
    base = [memslim_opt, src, "--pipeline=memslim-default", "--input-shapes=" + shapes, "-o", out]
    cli = memslim_opt_runner(memslim_opt, workdir)
    try:
        p = cli.run(base + ["--verify"], timeout=120)
    except subprocess.TimeoutExpired:
        return ("timeout", "cli", "memslim-opt --verify ran over 120 s")
    err = p.stderr.strip()
    lines = [ln for ln in err.splitlines() if not ln.startswith("remark:")]
    if p.returncode < 0:
        return (
            "crash",
            "cli",
            "memslim-opt --verify killed by signal %d (%s): %s"
            % (-p.returncode, signal.Signals(-p.returncode).name, " | ".join(lines[-3:])[:400]),
        )
    if p.returncode not in (0, 1):
        return (
            "crash",
            "cli",
            "memslim-opt --verify exit %d: %s" % (p.returncode, " | ".join(lines[-3:])[:400]),
        )
    verify_failed = p.returncode == 1 and "verify failed" in err
    if p.returncode == 1 and not verify_failed:
        clean = len(lines) == 1 and lines[0].startswith("memslim-opt: error:")
        return (
            "exception",
            "cli",
            ("" if clean else "[not one error line] ") + " | ".join(lines[:3])[:400],
        )
    if verify_failed:  # rerun without --verify to get the archive and judge it ourselves
        try:
            p2 = cli.run(base, timeout=120)
        except subprocess.TimeoutExpired:
            return ("timeout", "cli", "memslim-opt without --verify ran over 120 s")
        if p2.returncode != 0:
            return ("exception", "cli", "memslim-opt without --verify: " + p2.stderr.strip()[:300])
    try:
        got_mod = torch.jit.load(out)
        got = call(got_mod, inputs, trainable(got_mod))
    except Exception as e:
        return ("exception", "cli-output", "running memslim-opt's archive: " + first_line(e))
    w = compare(R, got, 0)
    if w is not None:
        detail = "memslim-opt's archive: %s rel %.3g > bar %.3g %s" % (
            w["tensor"],
            w["rel"],
            w.get("bar", 0),
            w["why"],
        )
        # memslim-opt cannot take the fp64 twin (its archives run on fp32 example inputs):
        # memslim.optimize's fp64 twin, the same pipeline, stands in for it.
        if R.dtype == "float32" and fp64_twin_same(prog, inputs, got, R):
            return (
                "fp32-rounding",
                "cli-output",
                detail + "; the fp64 twin through memslim.optimize "
                "matches fp64 eager within 1e-9, and the fp32 error is within 4 x eager's own",
            )
        return ("wrong", "cli-output", detail)
    if verify_failed:  # its archive passed our judge, its own check did not
        vline = [ln for ln in lines if "verify failed" in ln][0]
        return (
            "wrong",
            "cli-verify",
            vline[:400] + " (the archive itself matches eager on our inputs)",
        )
    return ("ok", "cli", "")


def default_memslim_opt() -> str:
    for p in (os.environ.get("MEMSLIM_OPT", ""), os.path.join(REPO, "build", "bin", "memslim-opt")):
        if p and os.path.exists(p):
            return p
    return ""
