# memslim differential fuzzer program (test/fuzz/gen.py), seed 916549
# features: coupling coupling_bn coupling_dropout coupling_gain dtype_float32 mode_train tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w2 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)
        self.w3 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)
        self.bn0 = torch.nn.BatchNorm1d(12)
        self.w4 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)

    def forward(self, x):
        v0 = torch.zeros_like(x)
        v1, v2 = torch.chunk(v0, 2, dim=-1)
        v3 = v2 * torch.sigmoid(F.linear(v2, self.w2))
        v4 = (F.hardsigmoid(v3)) * 30.0
        v5 = v1 + v4
        v6 = F.linear(self.bn0(v5), self.w3)
        v7 = torch.sigmoid(v6)
        v8 = v2 + v7
        v9 = torch.cat([v5, v8], dim=-1)
        v10, v11 = torch.chunk(v9, 2, dim=-1)
        v12 = F.linear(v11, self.w4)
        v13 = (F.dropout(F.elu(v12), p=0.25, training=self.training)) * 30.0
        v14 = v10 + v13
        v15 = F.linear(v14, self.w3)
        v16 = F.softplus(v15)
        v17 = v11 + v16
        v18 = torch.cat([v14, v17], dim=-1)
        return v18,


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(916549)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 24, dtype=torch.float32),)
