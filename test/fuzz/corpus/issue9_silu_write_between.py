# Issue 9: canonicalize-activations rewrote s = sigmoid(h); h.add_(1); r = h * s into
# silu(h), changing the output by 13%. The write sits between the two halves.
# features: linear hand_split hand_silu inplace_write write_between issue9
import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)

    def forward(self, x):
        h = F.linear(x, self.w0)
        s = torch.sigmoid(h)
        h.add_(1.0)
        r = h * s
        return r


def make():
    torch.manual_seed(0)
    m = P()
    m.train()
    return m, (torch.randn(8, 16),)
