# Issue 9: fuse-activation-dropout fused gelu -> dropout although dropout's output is
# written in place later (aten::add_(%d, 1, 1)); backward then failed ("modified by an
# inplace operation") where eager trains. Also found by the fuzzer (seeds 125, 285 before
# the safety gate). Random: judged under one seed against eager / the scripted module.
# features: linear act:gelu dropout inplace_write write_after_dropout issue9
import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)
        self.w1 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)

    def forward(self, x):
        h = F.linear(x, self.w0)
        d = F.dropout(F.gelu(h), 0.1, self.training)
        d.add_(1.0)
        return F.linear(d, self.w1)


def make():
    torch.manual_seed(0)
    m = P()
    m.train()
    return m, (torch.randn(8, 16),)
