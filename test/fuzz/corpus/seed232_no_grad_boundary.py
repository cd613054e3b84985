# Fuzzer finding (quick seed 232, 2026-11-24, the first run with no_grad blocks): a rewrite
# across a `with torch.no_grad()` boundary (gradient of x off by 26%).
# features: act:gelu_tanh act:hardswish act:hardswish_ act:leaky_relu act:mish act:silu_ act_inplace act_module dtype_float32 fracact hand_gelu hand_split inplace_write linear loop loop_accumulate loop_index mode_train no_grad pw_binary pw_unary sum_term tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.b0 = torch.nn.Parameter(torch.randn(8) * 0.1)
        self.w1 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)
        self.act0 = torch.nn.Mish()
        self.s0 = torch.nn.Parameter(torch.tensor(0.78))
        self.act1 = torch.nn.Hardswish()
        self.w2 = torch.nn.Parameter(torch.randn(8, 16) * 0.2500)
        self.w3 = torch.nn.Parameter(torch.randn(24, 16) * 0.2500)

    def forward(self, x):
        v1 = F.linear(x, self.w0, self.b0)
        v2 = F.linear(v1, self.w1)
        v3 = torch.zeros_like(x)
        for i in range(2):
            v4 = x * (i + 1)
            v5 = self.act0(v4)
            v5.copy_(v3)
            v3 = v3 + v5
        v6 = F.silu(v2, inplace=True)
        v7 = 1.0 + torch.erf(v6 * 0.7071067811865476)
        v8 = 0.5 * v6 * v7
        v8.copy_(v8)
        v9 = torch.sin(v8)
        t10_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t10_p = torch.where(v8 > 0, v8, 1.0)
        t10_p = 1.0507 * torch.pow(t10_p, 1 - t10_a) / torch.exp(torch.lgamma(2 - t10_a))
        t10_q = torch.where(v8 <= 0, v8, 1.0)
        t10_g = torch.exp(torch.lgamma(1 + t10_a))
        t10_acc = (1 - torch.exp(t10_q)) * t10_g / torch.exp(torch.lgamma(1 + t10_a))
        t10_acc = t10_acc - (1 - torch.exp(t10_q - 1.0)) * t10_g / torch.exp(torch.lgamma(t10_a))
        v10 = torch.where(v8 > 0, t10_p, 1.7581 / torch.pow(1.0, t10_a) * t10_acc)
        v11 = self.act1(v10)
        v12 = F.leaky_relu(v10, 0.2)
        with torch.no_grad():
            v13 = F.hardswish(v9, inplace=True)
            v14 = F.gelu(v11, approximate='tanh')
        v15 = F.linear(v12, self.w2)
        v16 = torch.where(v14 > v12, v14, v12 * 0.5)
        v17 = F.linear(v14, self.w3)
        return v16 + v7.sum() * 0.1 + v15.sum() * 0.1, v17 + v13.sum() * 0.1


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(232)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 8, dtype=torch.float32),)

