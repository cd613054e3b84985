# Issue 9's crashing program: memslim.optimize(P(True), example_inputs=(torch.randn(8, 16),))
# died with SIGSEGV inside recompute-pointwise-regions (Graph::createClone -> Node::addInput
# with a value the clone map does not know). Fixed seed case of the fuzzer's quick mode.
# features: linear act:gelu act:sigmoid act:mish if_attr sum_term issue9
import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self, flag: bool):
        super().__init__()
        self.flag = flag
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)
        self.w1 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)

    def forward(self, x):
        v0 = F.linear(x, self.w0)
        v1 = v0 * 1.5
        v2 = v0 * 1.5
        v3 = F.gelu(v2)
        if self.flag:
            v4 = torch.sigmoid(v3)
        else:
            v4 = v0 * 2.0
        v5 = F.linear(v4, self.w1)
        v6 = F.linear(v3, self.w1)
        v7 = F.mish(v5)
        return v6 + v1.sum() * 0.0 + v1 + v7.sum() * 0.0 + v7


def make():
    torch.manual_seed(0)
    m = P(True)
    m.train()
    return m, (torch.randn(8, 16),)
