# memslim differential fuzzer program (test/fuzz/gen.py), seed 88
# features: coupling coupling_bn coupling_dropout coupling_gain dtype_float32 mode_train pw_binary
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)
        self.bn0 = torch.nn.BatchNorm1d(12)
        self.w1 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)
        self.bn1 = torch.nn.BatchNorm1d(12)
        self.w2 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)
        self.bn2 = torch.nn.BatchNorm1d(12)
        self.w3 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)

    def forward(self, x, y):
        v0 = y - y
        v1, v2 = torch.chunk(v0, 2, dim=-1)
        v3 = F.linear(v2, self.w0)
        v4 = F.gelu(v3)
        v5 = v1 + v4
        v6 = F.linear(self.bn0(v5), self.w0)
        v7 = F.selu(v6)
        v8 = v2 + v7
        v9 = F.linear(self.bn1(v8), self.w1)
        v10 = (F.hardswish(v9)) * 30.0
        v11 = v5 + v10
        v12 = v11 * torch.sigmoid(F.linear(v11, self.w0))
        v13 = F.dropout(F.hardsigmoid(v12), p=0.25, training=self.training)
        v14 = v8 + v13
        v15 = torch.cat([v11, v14], dim=-1)
        v16, v17 = torch.chunk(v15, 2, dim=-1)
        v18 = F.linear(self.bn2(v17), self.w2)
        v19 = F.gelu(v18, approximate='tanh')
        v20 = v16 + v19
        v21 = v20 * torch.sigmoid(F.linear(v20, self.w3))
        v22 = F.mish(v21)
        v23 = v17 + v22
        v24 = torch.cat([v20, v23], dim=-1)
        return v24


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(88)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 24, dtype=torch.float32), torch.randn(4, 24, dtype=torch.float32))
