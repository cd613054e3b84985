# memslim differential fuzzer program (test/fuzz/gen.py), seed 88
# Regression (2026-11-24): group_norm of a constant input (y - y): x_hat is 0 in aten, so
# gamma's gradient is exactly 0. Rebuilding x_hat as y * (1/gamma) - beta/gamma gave 5e-7;
# (y - beta) / gamma gives 0, as aten.
# features: arg_bool dtype_float32 mode_train norm norm:group pw_binary pw_unary
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.g0 = torch.nn.Parameter(torch.where(torch.rand(24) < 0.3, torch.zeros(24), torch.randn(24) * 0.05))
        self.b0 = torch.nn.Parameter(torch.randn(24) * 0.1)

    def forward(self, x, y, b: bool):
        v2 = y - y
        v3 = torch.clamp(x, -2.0, 2.0)
        v4 = torch.tanh(v3)
        v5 = F.group_norm(v2, 2, self.g0, self.b0)
        v6 = torch.tanh(v5)
        return v6 + v4


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(88)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 24, dtype=torch.float32), torch.randn(4, 24, dtype=torch.float32), True)

