# Fuzzer finding (long-fuzz seed 701167, 2026-11-24; shrunk): a hand-written LayerNorm of rows that are
# constant to rounding (x - mean(x) is a tiny nonzero constant). The formula keeps that constant,
# x_hat = d * rsqrt(mean(d^2) + eps); canonicalize-norms' aten::layer_norm(d) subtracts mean(d) again
# and gives 0, so s0's gradient moves by 5.9e-4 (FX front end). Centring of 2026-11-24 fixed exactly
# constant rows (seed 600035), not these; bit-compatible needs the formula's own moments. Not fixed.
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.s0 = torch.nn.Parameter(torch.tensor(0.64))
        self.eps0 = 1e-6
        self.g0 = torch.nn.Parameter(torch.where(torch.rand(24) < 0.3, torch.zeros(24), torch.randn(24) * 0.05))
        self.w1 = torch.nn.Parameter(torch.randn(8, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(8) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)
        self.bn0 = torch.nn.BatchNorm1d(12)

    def forward(self, x):
        v0 = F.linear(x, self.w0)
        v1 = x - x
        v2 = torch.sigmoid(v1)
        v1.sub_(0.25)
        v3 = v1 * v2
        v4 = torch.where(v3 > v3, v3, v3 * 0.5)
        t8_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t8_p = torch.where(v4 > 0, v4, 1.0)
        t8_p = 1.0507 * torch.pow(t8_p, 1 - t8_a) / torch.exp(torch.lgamma(2 - t8_a))
        t8_q = torch.where(v4 <= 0, v4, 1.0)
        t8_g = torch.exp(torch.lgamma(1 + t8_a))
        t8_acc = (1 - torch.exp(t8_q)) * t8_g / torch.exp(torch.lgamma(1 + t8_a))
        t8_acc = t8_acc - (1 - torch.exp(t8_q - 1.0)) * t8_g / torch.exp(torch.lgamma(t8_a))
        v5 = torch.where(v4 > 0, t8_p, 1.7581 / torch.pow(1.0, t8_a) * t8_acc)
        v6 = ((v5 - v5.mean(-1, keepdim=True)) * torch.rsqrt(v5.var(-1, keepdim=True, unbiased=False) + self.eps0)) * self.g0
        v7 = v6 / (1.0 + torch.exp(-v6))
        v8 = F.linear(v5, self.w1, self.b0)
        v9, v10 = torch.chunk(v7, 2, dim=-1)
        v11 = F.linear(v10, self.w2)
        v12 = F.dropout(F.gelu(v11, approximate='tanh'), p=0.25, training=self.training)
        v13 = v9 + v12
        v14 = F.linear(self.bn0(v13), self.w2)
        v15 = F.dropout(F.mish(v14), p=0.25, training=self.training)
        v16 = v10 + v15
        v17 = torch.cat([v13, v16], dim=-1)
        return v8, v17 + v17.sum() * 0.1


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(701167)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 24, dtype=torch.float32),)
