# memslim differential fuzzer program (test/fuzz/gen.py), seed 800836
# features: coupling coupling_dropout dtype_float32 mode_train view_transpose
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w1 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w2 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w3 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w4 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)

    def forward(self, x):
        v0 = x.transpose(0, 1)
        v1, v2 = torch.chunk(v0, 2, dim=-1)
        v3 = F.linear(v2, self.w0)
        v4 = F.dropout(v3.relu(), p=0.25, training=self.training)
        v5 = v1 + v4
        v6 = F.linear(v5, self.w1)
        v7 = v6.sigmoid()
        v8 = v2 + v7
        v9 = torch.cat([v5, v8], dim=-1)
        v10, v11 = torch.chunk(v9, 2, dim=-1)
        v12 = F.linear(v11, self.w2)
        v13 = F.elu(v12)
        v14 = v10 + v13
        v15 = v14 * torch.sigmoid(F.linear(v14, self.w3))
        v16 = F.selu(v15)
        v17 = v11 + v16
        v18 = F.linear(F.layer_norm(v17, (4,)), self.w1)
        v19 = torch.sigmoid(v18)
        v20 = v14 + v19
        v21 = v20 * torch.sigmoid(F.linear(v20, self.w4))
        v22 = F.dropout(F.softplus(v21, beta=2.0, threshold=5.0), p=0.25, training=self.training)
        v23 = v17 + v22
        v24 = torch.cat([v20, v23], dim=-1)
        return v24


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(800836)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 16, dtype=torch.float32),)
