"""The fuzz runner's parent side: worker processes, crash isolation and the job pool.

What: `Worker` (a `runner.py worker` subprocess and its result pipe), `Session` (one worker
slot, restarting the worker after a crash, a timeout or `recycle` jobs), `Pool` (jobs on
several slots) and `run_job` (one job on a worker; a dying worker is blamed on that job,
in the stage it last reported).
Why: apart from the judge (runner.py and its stage modules), which runs inside the
workers; this side never imports torch.
"""

from __future__ import annotations

import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Iterable, Optional


from runner_common import HERE, REPO


class Worker:
    def __init__(self, memslim_opt: str, cli: bool, log_dir: str, index: int):
        r, w = os.pipe()
        env = dict(os.environ)
        env["FUZZ_RESULT_FD"] = str(w)
        env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("OMP_NUM_THREADS", "1")
        self.log_path = os.path.join(log_dir, "worker%d.log" % index)
        self.log = open(self.log_path, "ab")
        cmd = [
            sys.executable,
            "-u",
            os.path.join(HERE, "runner.py"),
            "worker",
            "--memslim-opt",
            memslim_opt or "",
        ]
        if not cli:
            cmd.append("--no-cli")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=self.log,
            pass_fds=(w,),
            env=env,
            text=True,
            start_new_session=True,
        )
        os.close(w)
        self.rfd = r
        self.buf = b""
        self.jobs_done = 0

    def readline(self, deadline: float) -> Optional[dict]:
        """Next protocol message; None on EOF (worker died); raises TimeoutError."""
        while b"\n" not in self.buf:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError
            rl, _, _ = select.select([self.rfd], [], [], min(left, 5.0))
            if not rl:
                continue
            chunk = os.read(self.rfd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def log_tail(self, start: int) -> str:
        try:
            self.log.flush()
            with open(self.log_path, "rb") as f:
                f.seek(start)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        lines = [
            ln
            for ln in text.splitlines()
            if ln.strip() and "warnings.warn" not in ln and "is deprecated" not in ln
        ]
        return " | ".join(lines[-4:])[:600]

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.close()

    def close(self):
        try:
            os.close(self.rfd)
        except OSError:
            pass
        self.log.close()


class Session:
    """One worker slot: runs jobs one at a time, restarting the worker after a crash,
    a timeout, or `recycle` jobs (bounds memory growth from compiled classes)."""

    def __init__(
        self,
        memslim_opt: str = "",
        cli: bool = True,
        timeout: float = 180.0,
        recycle: int = 150,
        log_dir: Optional[str] = None,
        index: int = 0,
    ):
        self.memslim_opt, self.cli, self.timeout, self.recycle = memslim_opt, cli, timeout, recycle
        self.own_logs = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="memslim-fuzz-logs-")
        self.index = index
        self.w: Optional[Worker] = None

    def run(self, job: dict) -> dict:
        if self.w is None:
            self.w = Worker(self.memslim_opt, self.cli, self.log_dir, self.index)
            msg = self.w.readline(time.time() + 180)
            if not msg or "ready" not in msg:
                tail = self.w.log_tail(0)
                self.w.kill()
                self.w = None
                raise RuntimeError("worker did not start: " + tail)
        res, self.w = run_job(self.w, job, self.timeout)
        if self.w is not None and self.w.jobs_done >= self.recycle:
            self.close()
        return res

    def close(self):
        if self.w is not None:
            try:
                self.w.proc.stdin.close()
                self.w.proc.wait(timeout=60)
                self.w.close()
            except Exception:  # noqa: BLE001
                self.w.kill()
            self.w = None

    def __del__(self):
        if getattr(self, "own_logs", False) and self.w is None:
            shutil.rmtree(self.log_dir, True)


class Pool:
    """Runs jobs ({"id", "seed"} or {"id", "source"}) on `jobs` worker processes."""

    def __init__(
        self,
        jobs: int = 2,
        memslim_opt: str = "",
        cli: bool = True,
        timeout: float = 180.0,
        recycle: int = 150,
        log_dir: Optional[str] = None,
    ):
        self.n, self.memslim_opt, self.cli, self.timeout, self.recycle = (
            jobs,
            memslim_opt,
            cli,
            timeout,
            recycle,
        )
        self.own_logs = log_dir is None  # worker logs (stderr): kept only when something crashed
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="memslim-fuzz-logs-")
        self.kept_logs = False

    def run(self, jobs: Iterable[dict], on_result: Callable[[dict], None]):
        q: "queue.Queue[dict]" = queue.Queue()
        for j in jobs:
            q.put(j)
        lock = threading.Lock()
        errors = []

        def slot(index: int):
            sess = Session(
                self.memslim_opt, self.cli, self.timeout, self.recycle, self.log_dir, index
            )
            try:
                while True:
                    try:
                        job = q.get_nowait()
                    except queue.Empty:
                        break
                    res = sess.run(job)
                    with lock:
                        if res["class"] in ("crash", "timeout", "runner-error"):
                            self.kept_logs = True
                        on_result(res)
            except Exception as e:  # noqa: BLE001 - surfaced to the caller
                errors.append(repr(e))
            finally:
                sess.close()

        threads = [threading.Thread(target=slot, args=(i,)) for i in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.own_logs and not errors and not self.kept_logs:
            shutil.rmtree(self.log_dir, True)
        if errors:
            raise RuntimeError("fuzz pool: " + "; ".join(errors))


def run_job(w: Worker, job: dict, timeout: float):
    """Runs one job on worker w: (result, w or None when the worker is gone). A worker
    that dies is blamed on this job, in the stage it last reported."""
    log_start = os.path.getsize(w.log_path)
    t0 = time.time()
    try:
        w.proc.stdin.write(json.dumps(job) + "\n")
        w.proc.stdin.flush()
    except BrokenPipeError:
        pass  # died already: readline sees EOF
    stage = "start"
    deadline = time.time() + timeout
    try:
        while True:
            msg = w.readline(deadline)
            if msg is None:
                w.proc.wait()
                rc = w.proc.returncode
                how = (
                    ("signal %d (%s)" % (-rc, signal.Signals(-rc).name))
                    if rc < 0
                    else "exit %d" % rc
                )
                res = {
                    "id": job["id"],
                    "class": "crash",
                    "stage": stage,
                    "detail": "worker died with %s in stage %s: %s"
                    % (how, stage, w.log_tail(log_start)),
                    "stages": {},
                    "seconds": round(time.time() - t0, 3),
                }
                w.close()
                return res, None
            if "stage" in msg:
                stage = msg["stage"]
            elif msg.get("done") == job["id"]:
                w.jobs_done += 1
                return msg["result"], w
    except TimeoutError:
        w.kill()
        return {
            "id": job["id"],
            "class": "timeout",
            "stage": stage,
            "detail": "no result after %.0f s (stage %s)" % (timeout, stage),
            "stages": {},
            "seconds": round(time.time() - t0, 3),
        }, None
