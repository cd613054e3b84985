# Fuzzer finding (long-fuzz seed 401503, 2026-11-24; bf16 there, this is its fp32 twin):
# x * tanh(softplus(x)) inside `with torch.no_grad()` became mish(x), beside the user's mish(x)
# outside the block; TorchScript's CSE merged the two, so v6 carried a gradient and x got one
# eager never gives it (|grad| 9.01 vs 0). The SafetyGate now refuses a new op whose CSE twin
# lies across a grad-mode switch.
# memslim differential fuzzer program (test/fuzz/gen.py), seed 401503
# features: act:mish act:softplus addcmul dropout dtype_bfloat16 hand_mish hand_split matmul mode_train no_grad sum_term tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 16) * 0.2500)
        self.drop0 = torch.nn.Dropout(0.2)

    def forward(self, x, y):
        v2 = torch.matmul(y, self.w0.t())
        v3 = F.mish(x)
        with torch.no_grad():
            v4 = torch.addcmul(x, v3, x, value=0.5)
            v5 = torch.tanh(F.softplus(x))
            v6 = x * v5
        v7 = F.softplus(v6, beta=2.0, threshold=5.0)
        v8 = self.drop0(v7)
        return v7 + v4.mean(), v8 + v2.mean() + v5.sum() * 0.1


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(401503)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 24, dtype=torch.float32), torch.randn(4, 16, dtype=torch.float32))

