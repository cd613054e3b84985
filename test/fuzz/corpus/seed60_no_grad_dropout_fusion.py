# Fuzzer finding (quick seed 60, 2026-11-24, the first run with no_grad blocks): elu inside
# `with torch.no_grad()`, its dropout outside; fuse-activation-dropout made them one op outside the
# block, so w1 got a gradient eager's program never gives it (14.8 vs 0).
# features: act:elu act:softplus dropout dtype_float32 hand_silu inplace_slice linear matmul mode_train no_grad pw_binary pw_unary sum_term
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 8) * 0.3536)
        self.w1 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.w2 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)

    def forward(self, x):
        v1 = torch.matmul(x, self.w0.t())
        v2 = F.linear(x, self.w1)
        v3 = F.softplus(x)
        v4 = v2 - x
        with torch.no_grad():
            v5 = F.elu(v4, alpha=0.5)
        v6 = v5.pow(2)
        v7 = F.dropout(v5, p=0.1, training=self.training)
        v8 = torch.sigmoid(v7) * v7
        v9 = F.linear(v7, self.w2)
        v6[:, 3:].mul_(0.5)
        return v9 + v1.sum() * 0.0 + v3.mean() + v8.sum() * 0.0


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(60)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 8, dtype=torch.float32),)

