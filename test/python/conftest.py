import os
import warnings

import pytest

# torch.jit.script warns as deprecated in torch 2.14; that one warning only.
warnings.filterwarnings(
    "ignore", message=r".*torch\.jit\.script.*deprecated", category=FutureWarning
)


# A pass that throws or leaves a broken graph fails the test instead of being
# rolled back silently (the SafetyGate's driver; see passes/include/memslim/jit/safety_gate.h).
os.environ.setdefault("MEMSLIM_STRICT", "1")
# The budget planner's plan cache (python/memslim/budget/plan_cache.py) off: a test's
# plan must come from its own dry runs (tests that monkeypatch a way of the planner would
# otherwise replay another test's plan); test_plan_cache.py turns it on in a directory
# of its own.
os.environ.setdefault("MEMSLIM_PLAN_CACHE", "0")


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test's compiles start from an empty Dynamo cache. Dynamo's recompile limit
    (8) counts the cache entries of one code object across the process: every
    memslim.compile of a class is a new backend (a partial), and torch.nn's own modules
    share one code (external_utils.inner), so a slow entry's later tests would run eager
    without a word, and under MEMSLIM_STRICT=1 (above) raise memslim.fallbacks'
    FallbackError, for what earlier tests compiled."""
    import sys

    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
    yield
