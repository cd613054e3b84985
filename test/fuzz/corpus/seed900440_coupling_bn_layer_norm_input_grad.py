# memslim differential fuzzer program (test/fuzz/gen.py), seed 900440, shrunk (2026-11-24): a known failure, see known_failures.txt
# features: act:relu_ act_inplace coupling coupling_bn dtype_float32 linear mode_train norm norm:layer norm:rms param_broadcast
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.b0 = torch.nn.Parameter(torch.randn(8) * 0.1)
        self.w1 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)
        self.g0 = torch.nn.Parameter(1.0 + torch.randn(8) * 0.1)
        self.norm0 = torch.nn.LayerNorm(8)
        self.g1 = torch.nn.Parameter(1.0 + torch.randn(8) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.bn0 = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        v0 = F.linear(x, self.w0, self.b0)
        v1 = F.linear(v0, self.w1)
        v2 = F.rms_norm(x, (8,), self.g0, eps=1e-6)
        torch.relu_(v2)
        v3 = self.norm0(v2)
        v4 = v3 * self.g1
        v5, v6 = torch.chunk(v4, 2, dim=-1)
        v7 = F.linear(F.layer_norm(v6, (4,)), self.w2)
        v8 = F.relu6(v7)
        v9 = v5 + v8
        v10 = F.linear(self.bn0(v9), self.w2)
        v11 = v10.relu()
        v12 = v6 + v11
        v13 = F.linear(v12, self.w2)
        v14 = F.celu(v13, alpha=1.5)
        v15 = v9 + v14
        v16 = F.linear(F.layer_norm(v15, (4,)), self.w2)
        v17 = F.softplus(v16, beta=2.0, threshold=5.0)
        v18 = v12 + v17
        v19 = torch.cat([v15, v18], dim=-1)
        return v19


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(900440)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 8, dtype=torch.float32),)
