"""bench/suite.py --quick end to end: the benchmark suite's one command on a tiny CNN.

Runs the quick mode in a subprocess (as a user would, into a temp dir) and checks that the
full table has a row for every variant, each with a number in every column or the one-line
reason why not, and that saved_tensors_hooks agreed with the autograd-graph walk. Needs
neither transformers nor matplotlib; about a minute on 2 cores (two torch.compile runs).
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VARIANT_TITLES = (
    "eager",
    "scripted/traced",
    "memslim.optimize",
    "checkpoint per block",
    "torch.compile",
    "torch.compile, budget 0.5",
    "memslim.fx.optimize (torch.export)",
    "torch.compile(backend=memslim)",
    "torch.compile(backend=memslim), budget 0.5",
    "memslim.optimize, memory_budget 0.5",
    "memslim.compile, memory_budget 0.5",
)
_NUM = r"[+-]?[\d,]+(\.\d+)?(e[+-]\d+)?%?"
# "58,076,160", "-6.3%", "8.5e-04 / 2.1e-06 (layer1.0.bn2.bias)", or eager's own "reference".
NUMBER = re.compile(rf"^{_NUM}( / {_NUM})?( \(.*\))?$|^reference$")


def test_quick_suite_writes_every_variant(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "suite.py"),
            "--quick",
            "--out-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=550,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    md = (tmp_path / "suite.md").read_text()
    assert (tmp_path / "suite_breakdown.md").exists()

    rows = {}
    for line in md.splitlines():
        if line.startswith("| tiny | 2x3x16x16 |"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[2]] = cells
    assert set(rows) == set(VARIANT_TITLES), md
    for title, cells in rows.items():
        # saved bytes .. grad diff after the last step: a number, or the notes give a reason.
        numbers_ok = all(NUMBER.match(c) for c in cells[3:12] if c != "")
        assert numbers_ok or cells[12], f"{title}: neither numbers nor a reason: {cells}"
    # The baseline itself must measure.
    assert all(NUMBER.match(c) for c in rows["eager"][3:12] if c != ""), rows["eager"]
    # Wherever the graph walk could see saved tensors, it agreed with the hooks.
    assert "| NO |" not in md
