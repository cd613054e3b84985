# memslim differential fuzzer program (test/fuzz/gen.py), seed 146
# Regression (2026-11-24): the rms_norm + exp(...) residual join read the exp region's
# output, a value the region op makes: memslim.fx raised IndexError applying it.
# features: act:hardsigmoid_ act:relu_ act_inplace act_module arg_float dtype_float32 matmul mode_train norm norm:layer norm:rms pw_binary pw_unary sum_term tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 8) * 0.3536)
        self.act0 = torch.nn.ReLU(inplace=True)
        self.norm0 = torch.nn.RMSNorm(8, eps=1e-6)

    def forward(self, x, s: float):
        v1 = torch.matmul(x, self.w0.t())
        v2 = F.layer_norm(v1, (24,))
        v3 = x * 0.5 + x * 0.25
        v4 = torch.where(v3 > x, v3, x * 0.5)
        v5 = torch.exp(x.clamp(max=3.0))
        F.hardsigmoid(v4, inplace=True)
        v6 = self.act0(v2)
        v7 = self.norm0(v4)
        return v6 + v6.sum() * 0.1, v7 + v5


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(146)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 8, dtype=torch.float32), -0.25)

