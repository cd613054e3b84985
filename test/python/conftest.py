import warnings

import pytest

# torch.jit.script warns as deprecated in torch 2.14; that one warning only.
warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*deprecated", category=FutureWarning)


@pytest.fixture(autouse=True)
def _seed():
    import torch
    torch.manual_seed(0)
