# Fuzz seed 924560 (2026-11-25), shrunk: two linked couplings with dropout, the second
# with a Glow half (v17 + v20) * sigmoid(v20 + 2) behind BatchNorm1d(1); the 1x1 weight w1's
# gradient off by 3.2e-4 (bar 1e-4). The fp64 twin matches eager within 1e-9 and the
# rebuilt input is off by 2e-7 relative (rounding of y = (x + t) m at |x + t| ~ 2.8 for
# |x| ~ 1, well under the 1e-5 drift bound): w1's gradient is a cancelling sum over 96 rows
# that amplifies that ~1500x, more than 4x eager's own fp32 error. The class of 919812;
# not fixed (known_failures.txt).
# memslim differential fuzzer program (test/fuzz/gen.py), seed 924560
# features: affine_addcmul cat coupling coupling_affine coupling_bn coupling_dropout dtype_float32 hand_gelu hand_split inplace_write mode_train nn_linear tuple_return view_reshape
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(16, 8, bias=False)
        self.g0 = torch.nn.Parameter(1.0 + torch.randn(8) * 0.1)
        self.b0 = torch.nn.Parameter(torch.randn(8) * 0.1)
        self.lin1 = torch.nn.Linear(8, 24, bias=True)
        self.w0 = torch.nn.Parameter(torch.randn(1, 1) * 1.0000)
        self.w1 = torch.nn.Parameter(torch.randn(1, 1) * 1.0000)
        self.w2 = torch.nn.Parameter(torch.randn(1, 1) * 1.0000)
        self.bn0 = torch.nn.BatchNorm1d(1)
        self.w3 = torch.nn.Parameter(torch.randn(1, 1) * 1.0000)

    def forward(self, x):
        v0 = self.lin0(x)
        v1 = 1.0 + torch.erf(v0 * 0.7071067811865476)
        v2 = 0.5 * v0 * v1
        v3 = torch.addcmul(self.b0, self.g0, v1)
        v2.mul_(0.5)
        v4 = self.lin1(v2)
        v5 = torch.tanh(F.softplus(v4))
        v6 = v5.reshape(96, 2)
        v7 = torch.cat([v4, v4], dim=1)
        v8, v9 = torch.chunk(v6, 2, dim=-1)
        v10 = F.linear(v9, self.w0)
        v11 = F.dropout(F.celu(v10, alpha=1.5), p=0.25, training=self.training)
        v12 = v8 + v11
        v13 = v12 * torch.sigmoid(F.linear(v12, self.w1))
        v14 = F.dropout(F.selu(v13), p=0.25, training=self.training)
        v15 = v9 + v14
        v16 = torch.cat([v12, v15], dim=-1)
        v17, v18 = torch.chunk(v16, 2, dim=-1)
        v19 = F.linear(self.bn0(v18), self.w2)
        v20 = F.selu(v19)
        v21 = (v17 + v20) * torch.sigmoid(v20 + 2.0)
        v22 = F.linear(F.layer_norm(v21, (1,)), self.w3)
        v23 = torch.relu(v22)
        v24 = v18 + v23
        v25 = torch.cat([v21, v24], dim=-1)
        return v7, v25


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(924560)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 16, dtype=torch.float32),)
