"""CUDA kernels against the CPU ones; skipped where no GPU exists (this project's machines)."""
import pytest
import torch

import memslim  # noqa: F401
from memslim import _numerics as N

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("name", sorted(N.CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_cuda_matches_cpu(name, dtype):
    c = N.CASES[name]
    x = (torch.randn(10_007) * 3).to(dtype)
    g = torch.randn_like(x)
    outs = []
    for dev in ("cpu", "cuda"):
        xd = x.to(dev).requires_grad_(True)
        y = c.ours(xd)
        y.backward(g.to(dev))
        outs.append((y.detach().cpu().double(), xd.grad.cpu().double()))
    (y0, g0), (y1, g1) = outs
    tol = {torch.float32: 1e-5, torch.float64: 1e-12}.get(dtype, 1e-2)
    torch.testing.assert_close(y1, y0, rtol=tol, atol=tol)
    torch.testing.assert_close(g1, g0, rtol=10 * tol, atol=10 * tol)


def test_cuda_saved_bytes_and_exact_list():
    x = torch.randn(64, 1024, device="cuda", requires_grad=True)
    n = x.numel()
    got = memslim.saved_bytes(lambda t: torch.ops.memslim.gelu(t), x)
    n_band = int(((x.detach() - N.CASES["gelu"].x_min).abs() < 2e-3).sum())
    assert got == 4 * n + n // 8 + 8 * n_band
