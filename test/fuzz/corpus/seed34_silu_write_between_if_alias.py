# Fuzzer finding (seed 34, minimized; before the safety gate): s = sigmoid(h); h.mul_(0.5); r = h * s
# with h a value joined from both branches of an if: canonicalize-activations made it silu(h)
# (gradient of x off by 24%). Fixed on main by the SafetyGate (00a69da).
# features: dtype_float32 hand_silu hand_split if_training inplace_write matmul mode_eval tuple_return write_between
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 8) * 0.3536)

    def forward(self, x):
        v0 = torch.matmul(x, self.w0.t())
        if self.training:
            v1 = v0
        else:
            v1 = v0
        v2 = torch.sigmoid(v1)
        v1.mul_(0.5)
        v3 = v1 * v2
        return v3,


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(34)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 8, dtype=torch.float32),)
