# Fuzz seed 922186 (2026-11-25), shrunk: a hand-written LayerNorm (mean / var / rsqrt) of
# y + sigmoid(s0): s0's true gradient is 0 (a shift the norm removes) and eager's cancelling
# sum gives exactly 0; memslim's canonicalized layer_norm gives 2e-7 (relative error inf).
# The class of seeds 912289 / 701167: an ulp-level result of a cancelling sum (known_failures.txt).
# memslim differential fuzzer program (test/fuzz/gen.py), seed 922186
# features: dtype_float32 linear loop loop_carried matmul mode_eval nn_linear norm norm:hand param_0dim pw_unary tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(24, 24, bias=True)
        self.s0 = torch.nn.Parameter(torch.tensor(0.75))
        self.g0 = torch.nn.Parameter(1.0 + torch.randn(24) * 0.1)
        self.w0 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.w1 = torch.nn.Parameter(torch.randn(24, 16) * 0.2500)

    def forward(self, x, y):
        v0 = self.lin0(x)
        v1 = y + torch.sigmoid(self.s0)
        v2 = self.g0 + ((v1 - v1.mean(-1, keepdim=True)) * torch.rsqrt(v1.var(-1, keepdim=True) + 1e-5)) * self.g0
        v3 = F.linear(v2, self.w0, self.b0)
        v4 = v3.clone()
        for i in range(2):
            v4 = v4 + v4 * 0.5
        v5 = torch.tanh(v3)
        v6 = torch.matmul(v4, self.w1.t())
        return v5, v6


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(922186)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 24, dtype=torch.float32), torch.randn(4, 24, dtype=torch.float32))
