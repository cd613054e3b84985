# memslim differential fuzzer program (test/fuzz/gen.py), seed 929001: under memslim.compile
# (MEMSLIM_FUZZ_COMPILE_BUDGET=none) its coupling chain is split out, and the piece before it
# holds memslim ops whose exact lists have unbacked sizes; compiled in Dynamo's shape
# environment, those symbols broke its guards (IndexError in produce_guards). Found 2026-11-27.
# features: act:hardswish act:hardswish_ act:silu act_inplace act_module coupling coupling_affine coupling_dropout dtype_bfloat16 hand_gelu hand_split if_training method method:relu mode_eval nn_linear pw_unary
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(8, 24, bias=False)
        self.act0 = torch.nn.Hardswish()
        self.w0 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)
        self.w1 = torch.nn.Parameter(torch.randn(12, 12) * 0.2887)

    def forward(self, x):
        v1 = self.lin0(x)
        v2 = v1 * 0.5 * (1.0 + torch.erf(v1 * 0.7071067811865476))
        v3 = torch.rsqrt(x * x + 1.0)
        v4 = self.fn0(v2)
        v5 = F.silu(v4)
        if self.training:
            v6 = torch.exp(v4.clamp(max=3.0))
            v10 = v6
        else:
            v7 = 1.0 + torch.erf(v5 * 0.7071067811865476)
            v8 = 0.5 * v5 * v7
            v9 = F.hardswish(v3, inplace=True)
            v10 = v8
        v11 = v10 * (torch.erf(v10 / 1.4142135623730951) + 1.0) * 0.5
        v12 = self.act0(v10)
        v13, v14 = torch.chunk(v12, 2, dim=-1)
        v15 = F.linear(v14, self.w0)
        v16 = F.relu6(v15)
        v17 = v13 * torch.exp(torch.tanh(v16)) + torch.tanh(v16)
        v18 = v17 * torch.sigmoid(F.linear(v17, self.w1))
        v19 = F.elu(v18, alpha=0.5)
        v20 = v14 + v19
        v21 = torch.cat([v17, v20], dim=-1)
        v22, v23 = torch.chunk(v21, 2, dim=-1)
        v24 = F.linear(F.layer_norm(v23, (12,)), self.w1)
        v25 = F.dropout(F.leaky_relu(v24, 0.2), p=0.25, training=self.training)
        v26 = v22 + v25
        v27 = F.linear(F.layer_norm(v26, (12,)), self.w0)
        v28 = F.relu6(v27)
        v29 = v23 + v28
        v30 = torch.cat([v26, v29], dim=-1)
        return v30 + v11

    def fn0(self, x):
        y = x * 1.0
        y.mul_(0.5)
        return F.relu(y)


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(929001)
    m = P().to(torch.bfloat16)
    m.eval()
    return m, (torch.randn(8, 8, dtype=torch.bfloat16),)

