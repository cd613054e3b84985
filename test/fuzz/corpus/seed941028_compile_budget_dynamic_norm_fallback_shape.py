# memslim differential fuzzer program (test/fuzz/gen.py), seed 941028: memslim.compile with
# memory_budget=0.5 and dynamic=True raised DynamicOutputShapeException (memslim.norm_fallback)
# in the compile of a piece split around a coupling chain (the _static per-shape compile),
# 2026-11-30; also before the planner moved into the partition step. Fixed: backend._in_mode.
# features: act:elu act:hardswish act:mish act:relu_ act:sigmoid act_inplace act_module addcdiv coupling coupling_affine coupling_bn coupling_dropout dtype_float32 if_training inplace_write mode_train nn_linear pw_unary sum_term tuple_return
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(16, 8, bias=True)
        self.act0 = torch.nn.Hardswish()
        self.act1 = torch.nn.ReLU(inplace=True)
        self.act2 = torch.nn.ELU()
        self.w0 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.bn0 = torch.nn.BatchNorm1d(4)
        self.w1 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.bn1 = torch.nn.BatchNorm1d(4)
        self.w2 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.bn2 = torch.nn.BatchNorm1d(4)
        self.w3 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w4 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)

    def forward(self, x):
        v1 = self.lin0(x)
        v2 = F.mish(x)
        v3 = v1.relu_()
        v4 = self.act0(v1)
        if self.training:
            v5 = -v2
            v8 = v5
        else:
            v6 = torch.sigmoid(v4)
            v7 = v2 / 2.0
            v8 = v7
        v9 = self.act1(v8)
        if self.training:
            v10 = 1.0 - v4
            v13 = v10
        else:
            v11 = x / 2.0
            v12 = -v4
            v13 = v12
        v14 = torch.addcdiv(v9, x, v8.abs() + 1.0, value=0.3)
        v4.add_(v13, alpha=0.5)
        if self.training:
            v15 = self.act2(v14)
            v17 = v15
        else:
            v16 = v14 / 2.0
            v17 = v16
        v18, v19 = torch.chunk(v4, 2, dim=-1)
        v20 = F.linear(self.bn0(v19), self.w0)
        v21 = F.dropout(F.softplus(v20, beta=2.0, threshold=5.0), p=0.25, training=self.training)
        v22 = v18 + v21
        v23 = F.linear(self.bn1(v22), self.w1)
        v24 = F.dropout(F.leaky_relu(v23, 0.2), p=0.25, training=self.training)
        v25 = (v19 + v24) * torch.sigmoid(v24 + 2.0)
        v26 = torch.cat([v22, v25], dim=-1)
        v27, v28 = torch.chunk(v26, 2, dim=-1)
        v29 = F.linear(v28, self.w0)
        v30 = torch.relu(v29)
        v31 = v27 + v30
        v32 = F.linear(self.bn2(v31), self.w2)
        v33 = F.softplus(v32)
        v34 = v28 + v33
        v35 = F.linear(v34, self.w3)
        v36 = F.softplus(v35)
        v37 = v31 + v36
        v38 = v37 * torch.sigmoid(F.linear(v37, self.w4))
        v39 = v38.relu()
        v40 = (v34 + v39) * torch.sigmoid(v39 + 2.0)
        v41 = torch.cat([v37, v40], dim=-1)
        return v17, v29 + v3.mean(), v41


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(941028)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 16, dtype=torch.float32),)

