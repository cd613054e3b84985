# memslim differential fuzzer program (test/fuzz/gen.py), seed 940108, minimized (fuzz.py shrink):
# under memslim.compile with memory_budget=0.5 (MEMSLIM_FUZZ_COMPILE_BUDGET=0.5, 2026-11-29) the
# planner took torch's knapsack at 0.21875, which kept 1,628 B of the graph it measured (the aten
# graph) and 1,900 B of Dynamo's graph, which the backend compiled: over the 1,630 B target,
# silently (budget-miss). The backend compiles the measured graph under a budget's plan now.
# features: dtype_float32 fracact linear loss_head matmul mode_eval sum_term
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(24) * 0.1)
        self.s0 = torch.nn.Parameter(torch.tensor(0.26))
        self.register_buffer("consts0", torch.tensor([0.0, 1.0, 2.0]), persistent=False)
        self.w1 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.w2 = torch.nn.Parameter(torch.randn(11, 16) * 0.2500)

    def forward(self, x, y):
        v0 = F.linear(y, self.w0, self.b0)
        t3_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t3_p = torch.where(x > 0, x, 1.0)
        t3_p = 1.0507 * torch.pow(t3_p, 1 - t3_a) / torch.exp(torch.lgamma(2 - t3_a))
        t3_q = torch.where(x <= 0, x, 1.0)
        t3_g = torch.exp(torch.lgamma(1 + t3_a))
        t3_n = self.consts0[1]
        t3_acc = (1 - torch.exp(t3_q)) * t3_g / torch.exp(torch.lgamma(1 + t3_a))
        t3_acc = t3_acc + (1 - torch.exp(t3_q - t3_n)) * t3_g / torch.exp(
            torch.lgamma(t3_a)
        ) * torch.pow(-1, t3_n)
        v1 = torch.where(x > 0, t3_p, 1.7581 / torch.pow(1.0, t3_a) * t3_acc)
        v2 = torch.matmul(v0, self.w1.t())
        v3 = (
            F.cross_entropy(
                F.linear(v2, self.w2),
                torch.where(torch.arange(8) % 3 == 1, 3, (torch.arange(8) * 7) % 11),
                reduction="mean",
                ignore_index=3,
                label_smoothing=0.0,
            )
            * v2
        ).to(v2.dtype)
        return v3 + v1.sum() * 0.0


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(940108)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 24, dtype=torch.float32), torch.randn(8, 24, dtype=torch.float32))
