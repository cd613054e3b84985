# memslim differential fuzzer program (test/fuzz/gen.py), seed 912289, shrunk (2026-11-24): a known failure, see known_failures.txt
# features: dtype_float64 hand_silu hand_split mode_eval norm norm:layer sum_term tuple_return view_reshape
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm0 = torch.nn.LayerNorm(16, bias=False)

    def forward(self, x):
        v0 = torch.sigmoid(x)
        v1 = x * v0
        v2 = self.norm0(v1)
        v3 = v2.reshape(8, 8)
        return v3.mean(),


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(912289)
    m = P().to(torch.float64)
    m.eval()
    return m, (torch.randn(4, 16, dtype=torch.float64),)
