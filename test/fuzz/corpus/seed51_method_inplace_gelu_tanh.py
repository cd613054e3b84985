# Fuzzer finding (seed 51, minimized; before the safety gate): a helper method writes its
# copy in place (y = x * 1.0; y.mul_(0.5)) and returns the tanh-GELU formula of it: the
# optimized module's output was off by 32%. Fixed on main by the SafetyGate (00a69da).
# features: method method:hand_gelu_tanh nn_linear tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(8, 24, bias=True)

    def forward(self, x):
        v0 = self.lin0(x)
        v1 = self.fn0(x)
        return x + v1,

    def fn0(self, x):
        y = x * 1.0
        y.mul_(0.5)
        return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))


def make():
    torch.manual_seed(51)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 8, dtype=torch.float32),)
