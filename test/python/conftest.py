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


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)
