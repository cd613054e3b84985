# memslim differential fuzzer program (test/fuzz/gen.py), seed 511694
# Regression (2026-11-24): a hand-written LayerNorm of x.t() (not contiguous) before nn.Dropout.
# canonicalize-norms made it aten::layer_norm, whose output is contiguous where the formula's
# keeps x.t()'s layout: dropout's mask (empty_like + bernoulli_) then fell on other elements
# (out:1 0.164 off eager). The canonicalization now needs a contiguous input.
# features: act:relu act:relu_ act_inplace addcmul arg_int contiguous dropout dtype_float32 inplace_slice linear mode_train no_grad norm norm:group norm:hand pw_binary tuple_return view_transpose
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.2500)
        self.b0 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.g0 = torch.nn.Parameter(1.0 + torch.randn(16) * 0.1)
        self.b1 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.g1 = torch.nn.Parameter(1.0 + torch.randn(4) * 0.1)
        self.b2 = torch.nn.Parameter(torch.randn(4) * 0.1)
        self.drop0 = torch.nn.Dropout(0.1)

    def forward(self, x, k: int):
        v1 = F.linear(x, self.w0, self.b0)
        v2 = F.group_norm(x, 2, self.g0, self.b1)
        v3 = v2.contiguous() * 1.0
        v4 = x.t()
        v5 = ((v4 - v4.mean(-1, keepdim=True)) / torch.sqrt((v4 - v4.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + 1e-6)) * self.g1 + self.b2
        v6 = v2 / (v2.abs() + 1.0)
        v6.relu_()
        F.relu(v1[:, :10], inplace=True)
        v7 = self.drop0(v5)
        with torch.no_grad():
            v8 = v7.relu()
        v9 = torch.addcmul(v8, v4, v4, value=0.5)
        return v3, v9


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(511694)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 16, dtype=torch.float32), 3)

