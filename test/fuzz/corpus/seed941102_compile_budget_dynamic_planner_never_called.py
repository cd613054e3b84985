# memslim differential fuzzer program (test/fuzz/gen.py), seed 941102: memslim.compile with
# memory_budget=0.5 and dynamic=True raised "TypeError: 'NoneType' object is not subscriptable"
# (2026-11-30): a graph's compile never called the planner (budget.partitioner) and
# compile_planned read its plan all the same.
# features: act:selu_ act_inplace addcdiv addcmul dtype_float32 hand_gelu_tanh hand_hardswish matmul mode_eval no_grad pw_binary sum_term
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)

    def forward(self, x):
        v1 = x * torch.sigmoid(x)
        v2 = torch.matmul(x, self.w0.t())
        v3 = F.selu(v1, inplace=True)
        F.selu(v2, inplace=True)
        v4 = 0.5 * v1 * (1.0 + torch.tanh(0.7978845608028654 * (v1 + 0.044715 * v1 * v1 * v1)))
        v5 = torch.addcmul(v4, v4, v3, value=0.5)
        with torch.no_grad():
            v6 = v2 * v2
            v7 = v1 * F.relu6(v1 + 3.0) / 6.0
            v8 = torch.addcdiv(v5, v4, v5.abs() + 1.0, value=0.3)
        return v8 + v6.mean() + v7


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(941102)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 8, dtype=torch.float32),)

