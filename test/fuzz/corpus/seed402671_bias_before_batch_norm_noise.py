# Fuzzer finding (long-fuzz seed 402671, 2026-11-24, fp64): lin0's bias feeds a BatchNorm, so its
# true gradient is zero and eager's is rounding noise (1e-17); the hardsigmoid's mask-only op
# rounds its gradient differently and the noise differs entirely (relative 1.03). The judge now
# measures each tensor's own noise (eager under an 8-ulp perturbation of parameters and inputs)
# and judges a tensor that moves by more than half of itself at that scale: ok.
# memslim differential fuzzer program (test/fuzz/gen.py), seed 402671
# features: act:hardsigmoid dtype_float64 inplace_write mode_train nn_linear norm norm:batch sum_term tuple_return view_slice
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(8, 8, bias=True)
        self.rm0 = torch.nn.Buffer(torch.randn(8) * 0.1)
        self.rv0 = torch.nn.Buffer(torch.rand(8) + 0.5)
        self.g0 = torch.nn.Parameter(torch.where(torch.rand(8) < 0.3, torch.zeros(8), torch.randn(8) * 0.05))
        self.b0 = torch.nn.Parameter(torch.randn(8) * 0.1)

    def forward(self, x, y):
        v2 = self.lin0(x)
        v3 = F.batch_norm(v2, self.rm0, self.rv0, self.g0, self.b0, training=self.training)
        v3.mul_(0.5)
        v4 = v3.narrow(1, 0, 1)
        v5 = v3[:, :3]
        v4.add_(1.0)
        v6 = F.hardsigmoid(v5)
        return v6, v5.mean()


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(402671)
    m = P().to(torch.float64)
    m.train()
    return m, (torch.randn(8, 8, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64))

