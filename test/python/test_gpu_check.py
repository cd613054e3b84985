"""scripts/gpu_check.sh's dry run, so that the GPU check cannot rot between GPU loans.

What: the dry run (forced, and what a machine without a GPU gets anyway) prints the plan
with every GPU step and its estimated seconds, lists those steps as skipped, runs part 3
on the CPU (the same code the GPU runs, small), writes its table with the date and the
commit under $OUT, and exits 0; a bad argument is one line and exit 2. A few seconds (part
3 only); the whole dry run, every part and the models on the CPU, is the ctest entry
gpu_check_dry_run (label slow).
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")


def _run(*args, out=None):
    env = dict(os.environ, PYTHON=sys.executable)
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT
    )


def test_dry_run_lists_the_gpu_steps_and_runs_the_rest(tmp_path):
    proc = _run("--dry-run", "--parts", "3", out=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for step in ("build", "3 speed"):
        assert re.search(rf"^  {re.escape(step)}\s+\d+ s  .*\[skipped: dry run\]$", text, re.M), (
            text
        )
    assert re.search(r"^  total\s+\d+ s", text, re.M)
    assert re.search(r"^\| build \| .* \| skip \| GPU step \(dry run\); ~\d+ s", text, re.M), text
    assert re.search(r"^\| 3 speed \(cpu\) \| gelu fp32 \| info \|", text, re.M), text
    assert "0 FAIL" in text
    report = (tmp_path / "gpu_check.md").read_text()
    assert re.search(r"^\d{4}-\d\d-\d\d, commit \S+", report, re.M), report[:400]
    assert "| 3 speed (cpu) | relu bf16 |" in report


def test_bad_argument_is_one_line_and_exit_2():
    proc = _run("--no-such-flag")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gpu_check: unknown argument --no-such-flag (see scripts/gpu_check.sh --help)"
    ]
    proc = _run("--dry-run", "--parts", "7")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gpu_check: --parts takes a list of 1, 2, 3, 4 such as 1,3"
    ]
