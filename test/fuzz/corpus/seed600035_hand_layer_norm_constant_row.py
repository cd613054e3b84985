# Fuzzer finding (long-fuzz seed 600035, 2026-11-24; minimized): a hand-written LayerNorm of
# rows that are exactly constant. Eager's formula gives x - mean = 0 exactly, so the gamma
# gradient is exactly 0; canonicalize-norms turned the formula into aten::layer_norm of x,
# whose one-pass moments left x_hat at ~1e-5 there (the eps-dominated rstd, 316, scales the
# last bit of the mean), and the gamma gradient read 2.5e-5 through both front ends. Fixed
# on 2026-11-24 (bdf6efc): the formula's centring x - mean stays, and layer_norm normalises it.
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.g0 = torch.nn.Parameter(1.0 + torch.randn(24) * 0.1)
        self.b0 = torch.nn.Parameter(torch.randn(24) * 0.1)

    def forward(self, x):
        v = x * 0.0 + 0.18
        u = v - v.mean(-1, keepdim=True)
        return self.b0 + (u / torch.sqrt(u.pow(2).mean(-1, keepdim=True) + 1e-5)) * self.g0


def make():
    torch.manual_seed(0)
    return P(), (torch.randn(8, 24),)
