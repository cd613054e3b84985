# memslim differential fuzzer program (test/fuzz/gen.py), seed 941051: memslim.compile with
# memory_budget=0.5 and dynamic=True raised "a dry run could not put the ladder's recompute tags on
# the joint graph (no node provenance)" (2026-11-30): Inductor's joint passes left the tagged region's
# nodes (a fractional activation: lgamma, pow, exp) without provenance to the planned graph.
# features: act:relu6 dtype_float32 fracact gated_mlp inplace_slice linear loop loop_accumulate loop_index mode_train nn_linear pw_unary tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.lin0 = torch.nn.Linear(24, 24, bias=True)
        self.s0 = torch.nn.Parameter(torch.tensor(0.33))
        self.register_buffer("consts0", torch.tensor([0.0, 1.0, 2.0]), persistent=False)
        self.w1 = torch.nn.Parameter(torch.randn(24, 16) * 0.2500)
        self.w2 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)

    def forward(self, x):
        v1 = F.linear(x, self.w0)
        v2 = torch.zeros_like(x)
        for i in range(2):
            v3 = x * (i + 1)
            v4 = torch.rsqrt(v3 * v3 + 1.0)
            v5 = self.lin0(v4)
            v2 = v2 + v5
        t6_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t6_p = torch.where(v1 > 0, v1, 1.0)
        t6_p = 1.0507 * torch.pow(t6_p, 1 - t6_a) / torch.exp(torch.lgamma(2 - t6_a))
        t6_q = torch.where(v1 <= 0, v1, 1.0)
        t6_g = torch.exp(torch.lgamma(1 + t6_a))
        t6_n = self.consts0[1]
        t6_acc = (1 - torch.exp(t6_q)) * t6_g / torch.exp(torch.lgamma(1 + t6_a))
        t6_acc = t6_acc + (1 - torch.exp(t6_q - t6_n)) * t6_g / torch.exp(torch.lgamma(t6_a)) * torch.pow(-1, t6_n)
        v6 = torch.where(v1 > 0, t6_p, 1.7581 / torch.pow(1.0, t6_a) * t6_acc)
        v6[:, :11] = v1[:, :11]
        v7 = F.linear(v1, self.w1)
        v8 = F.linear(v1, self.w1)
        v9 = v8 * F.relu6(v7)
        v10 = F.linear(v9, self.w2)
        return v2, v10


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(941051)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 24, dtype=torch.float32),)

