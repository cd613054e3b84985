"""What the fuzz-regression tests share (test_fuzz_regressions*.py): the fuzzer's runner
(test/fuzz/runner.py), the header every program body gets, a worker that runs a program
through every stage, and the checks that its result is "ok".
Why a module of its own: the findings are split over several test files by topic; one copy
of the harness keeps them judged alike."""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "test", "fuzz"))

import runner  # noqa: E402

HEADER = """import math

import torch
import torch.nn.functional as F
"""


def worker(cli: bool = True):
    """A runner.Session for a module-scoped fixture: yields it, closes it at the end."""
    s = runner.Session(runner.default_memslim_opt(), cli=cli, timeout=300)
    yield s
    s.close()


def check_source(session, source: str) -> dict:
    res = session.run({"id": "regression", "source": source})
    assert res["class"] == "ok", "%s@%s: %s (stages: %s)" % (
        res["class"],
        res.get("stage"),
        res.get("detail"),
        res.get("stages"),
    )
    return res


def check(session, body: str):
    check_source(session, HEADER + body)


def check_corpus(session, name: str) -> dict:
    """A minimized finding kept as a corpus file (the fuzz_quick ctest runs it too)."""
    with open(os.path.join(REPO, "test", "fuzz", "corpus", name)) as f:
        return check_source(session, f.read())
