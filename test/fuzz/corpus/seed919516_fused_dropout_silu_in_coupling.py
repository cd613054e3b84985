# Fuzz seed 919516 (2026-11-25), shrunk: a coupling-shaped block (chunk / LayerNorm / dropout after
# silu / cat) behind a FracAct region on a no-grad input; s0's gradient off by 1.3e-4 (bar 1e-4;
# 4.8e-3 unshrunk). With fuse-activation-dropout left out the rewrite is exact; not understood
# yet (known_failures.txt).
# memslim differential fuzzer program (test/fuzz/gen.py), seed 919516
# features: coupling coupling_dropout dtype_float32 fracact hand_gelu hand_silu hand_split linear mode_train no_grad pw_unary tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.s0 = torch.nn.Parameter(torch.tensor(0.43))
        self.register_buffer("consts0", torch.tensor([0.0, 1.0, 2.0]), persistent=False)
        self.w1 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w2 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)

    def forward(self, x):
        v0 = F.linear(x, self.w0)
        with torch.no_grad():
            v1 = torch.sigmoid(x)
            v2 = x * v1
            v3 = torch.sqrt(v2.abs() + 1.0)
        t8_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t8_p = torch.where(v3 > 0, v3, 1.0)
        t8_p = 1.0507 * torch.pow(t8_p, 1 - t8_a) / torch.exp(torch.lgamma(2 - t8_a))
        t8_q = torch.where(v3 <= 0, v3, 1.0)
        t8_g = torch.exp(torch.lgamma(1 + t8_a))
        t8_n = self.consts0[1]
        t8_acc = (1 - torch.exp(t8_q)) * t8_g / torch.exp(torch.lgamma(1 + t8_a))
        t8_acc = t8_acc + (1 - torch.exp(t8_q - t8_n)) * t8_g / torch.exp(torch.lgamma(t8_a)) * torch.pow(-1, t8_n)
        v4 = torch.where(v3 > 0, t8_p, 1.7581 / torch.pow(1.0, t8_a) * t8_acc)
        v5 = v4 * 0.5 * (1.0 + torch.erf(v4 * 0.7071067811865476))
        v6 = torch.rsqrt(v5 * v5 + 1.0)
        v7, v8 = torch.chunk(v6, 2, dim=-1)
        v9 = F.linear(F.layer_norm(v8, (4,)), self.w1)
        v10 = F.softplus(v9)
        v11 = v7 + v10
        v12 = F.linear(F.layer_norm(v11, (4,)), self.w2)
        v13 = F.dropout(F.silu(v12), p=0.25, training=self.training)
        v14 = v8 + v13
        v15 = torch.cat([v11, v14], dim=-1)
        return v12, v15


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(919516)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 8, dtype=torch.float32),)
