# Fuzz seed 500804 (2026-11-29, the 2,000-program run after the one-core restructuring; also
# wrong at 7c33213, before it): affine couplings with BatchNorm and dropout, group norm, a
# residual join; through memslim.fx.optimize w1's gradient 1.7e-4 off (bar 1e-4). The class of
# 919812 / 924560; not understood yet (known_failures.txt). Not shrunk.
# memslim differential fuzzer program (test/fuzz/gen.py), seed 500804
# features: act:elu act:softplus act_module coupling coupling_affine coupling_bn coupling_dropout dtype_float32 hand_mish hand_split if_attr inplace_write linear mode_train norm norm:group pw_unary residual_join sum_term tuple_return view_slice
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self, flag0: bool):
        super().__init__()
        self.flag0 = flag0
        self.w0 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.act0 = torch.nn.Softplus()
        self.w1 = torch.nn.Parameter(torch.randn(8, 24) * 0.2041)
        self.w2 = torch.nn.Parameter(torch.randn(2, 2) * 0.7071)
        self.w3 = torch.nn.Parameter(torch.randn(1, 1) * 1.0000)
        self.bn0 = torch.nn.BatchNorm1d(1)
        self.w4 = torch.nn.Parameter(torch.randn(1, 1) * 1.0000)
        self.w5 = torch.nn.Parameter(torch.randn(1, 1) * 1.0000)
        self.bn1 = torch.nn.BatchNorm1d(1)
        self.w6 = torch.nn.Parameter(torch.randn(1, 1) * 1.0000)
        self.bn2 = torch.nn.BatchNorm1d(1)

    def forward(self, x):
        v1 = F.linear(x, self.w0)
        v2 = self.act0(x)
        v3 = F.linear(x, self.w1)
        v4 = v3[:, :2]
        v5 = F.elu(x, alpha=0.5)
        if self.flag0:
            v6 = v4 * 2.0 - 1.0
            v8 = v6
        else:
            v7 = v4 / 2.0
            v8 = v7
        v9 = F.elu(v1)
        v10 = torch.tanh(F.softplus(v4))
        v11 = v4 * v10
        v8.add_(v10, alpha=0.5)
        v12 = torch.tanh(F.softplus(v11))
        v13 = v11 * v12
        v14 = F.group_norm(v11, 2)
        v15 = F.hardsigmoid(v12)
        v16 = v14 + v15
        F.relu(v16, inplace=True)
        v17 = F.linear(v16, self.w2)
        v18, v19 = torch.chunk(v17, 2, dim=-1)
        v20 = F.linear(v19, self.w3)
        v21 = F.dropout(F.relu6(v20), p=0.25, training=self.training)
        v22 = v18 + v21
        v23 = F.linear(self.bn0(v22), self.w3)
        v24 = F.hardsigmoid(v23)
        v25 = v19 + v24
        v26 = torch.cat([v22, v25], dim=-1)
        v27, v28 = torch.chunk(v26, 2, dim=-1)
        v29 = F.linear(v28, self.w4)
        v30 = torch.tanh(v29)
        v31 = v27 + v30
        v32 = v31 * torch.sigmoid(F.linear(v31, self.w4))
        v33 = F.leaky_relu(v32, 0.2)
        v34 = v28 + v33
        v35 = torch.cat([v31, v34], dim=-1)
        v36, v37 = torch.chunk(v35, 2, dim=-1)
        v38 = F.linear(self.bn1(v37), self.w5)
        v39 = F.dropout(F.silu(v38), p=0.25, training=self.training)
        v40 = v36 + v39
        v41 = F.linear(self.bn2(v40), self.w6)
        v42 = F.softplus(v41, beta=2.0, threshold=5.0)
        v43 = (v37 + v42) * torch.sigmoid(v42 + 2.0)
        v44 = torch.cat([v40, v43], dim=-1)
        return v29 + v2.sum() * 0.0 + v5.sum() * 0.0 + v13.mean() + v15.sum() * 0.1 + v16.sum() * 0.1, v44 + v9.mean() + v14


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(500804)
    m = P(False).to(torch.float32)
    m.train()
    return m, (torch.randn(8, 24, dtype=torch.float32),)

