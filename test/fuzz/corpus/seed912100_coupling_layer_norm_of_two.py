# memslim differential fuzzer program (test/fuzz/gen.py), seed 912100, shrunk (2026-11-24): a known failure, see known_failures.txt
# features: act:sigmoid coupling dtype_float32 hand_mish hand_split linear matmul method method:relu mode_eval tuple_return view_transpose
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 8) * 0.3536)
        self.w1 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.w2 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.w3 = torch.nn.Parameter(torch.randn(2, 2) * 0.7071)
        self.w4 = torch.nn.Parameter(torch.randn(2, 2) * 0.7071)

    def forward(self, x):
        v0 = torch.matmul(x, self.w0.t())
        v1 = torch.sigmoid(v0)
        v2 = torch.tanh(F.softplus(v1))
        v3 = torch.tanh(F.softplus(v2)) * v2
        v4 = F.linear(v3, self.w1)
        v5 = F.linear(v3, self.w2, self.b0)
        v6 = v5.t()
        v7 = self.fn1(v6)
        v8, v9 = torch.chunk(v7, 2, dim=-1)
        v10 = F.linear(v9, self.w3)
        v11 = F.silu(v10)
        v12 = v8 + v11
        v13 = F.linear(F.layer_norm(v12, (2,)), self.w4)
        v14 = F.silu(v13)
        v15 = v9 + v14
        v16 = torch.cat([v12, v15], dim=-1)
        v17, v18 = torch.chunk(v16, 2, dim=-1)
        v19 = F.linear(v18, self.w3)
        v20 = v19.sigmoid()
        v21 = v17 + v20
        v22 = F.linear(v21, self.w4)
        v23 = F.elu(v22)
        v24 = v18 + v23
        v25 = torch.cat([v21, v24], dim=-1)
        return v6, v25

    def fn1(self, x):
        y = x * 1.0
        y.mul_(0.5)
        return y.relu()


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(912100)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 8, dtype=torch.float32),)
