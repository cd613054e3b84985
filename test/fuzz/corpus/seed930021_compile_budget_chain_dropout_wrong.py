# memslim differential fuzzer program (test/fuzz/gen.py), seed 930021: under memslim.compile with
# memory_budget=0.3 (MEMSLIM_FUZZ_COMPILE_BUDGET=0.3) w0's gradient is 0.395 off eager, with and
# without way 2, and without a budget (2026-11-28): split around the coupling chain, the first
# piece ended in v1.add_(x, alpha=0.5) on linear(x, w0), which Inductor's add(mm, c) -> addmm
# pattern fuses without the alpha (torch 2.14.1; plain torch.compile too). Fixed by
# memslim.inductor_guards (2026-11-28).
# features: act:sigmoid act:tanh_ act_inplace cat coupling coupling_affine coupling_bn coupling_dropout dtype_float32 hand_silu hand_split if_training inplace_write linear method method:silu mode_train pw_unary sum_term tuple_return view_unsqueeze write_between
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.w1 = torch.nn.Parameter(torch.randn(16, 16) * 0.2500)
        self.w2 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.w3 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.w4 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.w5 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.bn0 = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        v1 = F.linear(x, self.w0)
        if self.training:
            v1.add_(x, alpha=0.5)
            v2 = x * 1.5
            v4 = v2
        else:
            v3 = x / 2.0
            v4 = v3
        v5 = self.fn0(x)
        v6 = v1.unsqueeze(0)
        v7 = v6.squeeze(0)
        v8 = torch.exp(x.clamp(max=3.0))
        v9 = torch.cat([v5, v8], dim=1)
        v10 = v9.sigmoid()
        v1.tanh_()
        v11 = torch.sigmoid(v9)
        v9.masked_fill_(v9 > 2.0, 2.0)
        v12 = v9 * v11
        v13 = F.linear(v11, self.w1)
        v14, v15 = torch.chunk(v13, 2, dim=-1)
        v16 = v15 * torch.sigmoid(F.linear(v15, self.w2))
        v17 = torch.relu(v16)
        v18 = v14 + v17
        v19 = F.linear(F.layer_norm(v18, (8,)), self.w3)
        v20 = F.dropout(v19.sigmoid(), p=0.25, training=self.training)
        v21 = v15 + v20
        v22 = torch.cat([v18, v21], dim=-1)
        v23, v24 = torch.chunk(v22, 2, dim=-1)
        v25 = F.linear(v24, self.w4)
        v26 = F.relu6(v25)
        v27 = v23 * torch.exp(torch.tanh(v26)) + torch.tanh(v26)
        v28 = F.linear(self.bn0(v27), self.w5)
        v29 = F.elu(v28, alpha=0.5)
        v30 = v24 + v29
        v31 = torch.cat([v27, v30], dim=-1)
        v32, v33 = torch.chunk(v31, 2, dim=-1)
        v34 = v33 * torch.sigmoid(F.linear(v33, self.w3))
        v35 = F.relu(v34)
        v36 = v32 + v35
        v37 = v36 * torch.sigmoid(F.linear(v36, self.w4))
        v38 = F.softplus(v37)
        v39 = (v33 + v38) * torch.sigmoid(v38 + 2.0)
        v40 = torch.cat([v36, v39], dim=-1)
        return v12 + v4.sum() * 0.1 + v7.sum() * 0.1, v40 + v6.mean() + v10

    def fn0(self, x):
        return F.silu(x)


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(930021)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 8, dtype=torch.float32),)

