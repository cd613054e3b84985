"""bench/zoo_compile.py's table cannot hide a failure: a way that raised, a fallback in
memslim's records and a frame Dynamo's counters say it gave up on each show in the "runs"
column in bold; a cell that crashed before any way is one row; the budget's way is named.
Synthetic rows, no compile."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import zoo_compile as Z  # noqa: E402

META = {"date": "2026-11-29", "commit": "abc", "torch": "2.14.1", "transformers": "5.24.0"}
META["command"] = "python bench/zoo_compile.py"


def _way(saved=1000, step=1.0, **extra):
    row = {"saved": saved, "step_s": step, "grad_vs_eager": 1e-7, "grad_vs_fp64": 1e-3}
    row["dynamo"] = {"frames_compiled": 1, "graph_breaks": 0, "frames_given_up": 0}
    row.update(extra)
    return row


def _table(ways, crash=None):
    res = {"model": "gpt2", "dtype": "fp32", "ways": ways}
    if crash:
        res["crash"] = crash
    return Z.render({("gpt2", "fp32"): res}, META)


def _line(text, way):
    [line] = [ln for ln in text.splitlines() if ln.startswith(f"| gpt2 | fp32 | {way} |")]
    return line


def test_a_failure_a_fallback_and_a_frame_given_up_are_in_bold():
    given_up = _way()
    given_up["dynamo"].update(
        frames_given_up=1, given_up_causes={"Dynamo recompile limit exceeded": 1}
    )
    text = _table(
        {
            "eager": _way(),
            "torch.compile": given_up,
            'backend="memslim"': _way(fallbacks=["graph compiled by Inductor unchanged: X"]),
            "memslim.compile(0.5)": {"error": "FallbackError: memslim (strict): Dynamo gave up"},
        }
    )
    assert "**1 frame(s) Dynamo gave up**: Dynamo recompile limit exceeded" in _line(
        text, "torch.compile"
    )
    assert "**fallback**: graph compiled by Inductor unchanged" in _line(text, 'backend="memslim"')
    assert "**failed**: FallbackError" in _line(text, r"memslim.compile(0.5)")


def test_a_crash_before_any_way_is_one_row_and_a_budget_is_named():
    text = _table({}, crash="rc 1 in phase fp64: boom")
    assert "| gpt2 | fp32 | - | **crashed**: rc 1 in phase fp64: boom |" in text
    note = "budget 5 B of 10 B ... (parameters excluded): met by torch's own knapsack at 0.5 (keeps 4 B)"
    budget = _way(rewrote={"fuse-loss-head": 1}, notes=[note])
    text = _table({"eager": _way(), "torch.compile": _way(), "memslim.compile(0.5)": budget})
    assert (
        "budget met by torch's own knapsack at 0.5 (the pipeline's candidates: fuse-loss-head x1)"
        in (_line(text, r"memslim.compile(0.5)"))
    )
