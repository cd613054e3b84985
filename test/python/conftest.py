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
