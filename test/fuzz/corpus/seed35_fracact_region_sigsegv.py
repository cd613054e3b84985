# Fuzzer finding (seed 35, minimized; before the safety gate): memslim.optimize died with
# SIGSEGV (recompute-pointwise-regions) on a FracAct-like formula next to hardswish ->
# dropout -> cat. Fixed on main by the SafetyGate (00a69da).
# features: act:hardswish cat dropout fracact nn_linear sum_term tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(8, 16, bias=False)
        self.s0 = torch.nn.Parameter(torch.tensor(1.18))
        self.register_buffer("consts0", torch.tensor([0.0, 1.0, 2.0]), persistent=False)

    def forward(self, x):
        v0 = self.lin0(x)
        v1 = F.hardswish(v0)
        v2 = F.dropout(v1, 0.1, True)
        t4_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t4_p = torch.where(v1 > 0, v1, 1.0)
        t4_p = 1.0507 * torch.pow(t4_p, 1 - t4_a) / torch.exp(torch.lgamma(2 - t4_a))
        t4_q = torch.where(v1 <= 0, v1, 1.0)
        t4_g = torch.exp(torch.lgamma(1 + t4_a))
        t4_n = self.consts0[1]
        t4_acc = (1 - torch.exp(t4_q)) * t4_g / torch.exp(torch.lgamma(1 + t4_a))
        t4_acc = t4_acc + (1 - torch.exp(t4_q - t4_n)) * t4_g / torch.exp(torch.lgamma(t4_a)) * torch.pow(-1, t4_n)
        v3 = torch.where(v1 > 0, t4_p, 1.7581 / torch.pow(1.0, t4_a) * t4_acc)
        v4 = torch.cat([v2, x], dim=1)
        v5 = torch.cat([v4, v2], dim=1)
        return v5 + v3.mean(),


def make():
    torch.manual_seed(35)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 8, dtype=torch.float32),)
