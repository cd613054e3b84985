# memslim differential fuzzer program (test/fuzz/gen.py), seed 941003: under memslim.compile with
# memory_budget=0.5 and dynamic=True the compiled graph kept 1,728 B where the fuzz judge's target
# is 1,568 B (0.5 of plain torch.compile's 3,136 B), with no error and no record saying so
# (budget-miss, 2026-11-30; also before the planner moved into the partition step). A coupling chain block's drift anchor (its exact input kept); said by a record now.
# features: act:elu act:mish_ act:relu act:selu act:sigmoid_ act_inplace coupling coupling_bn coupling_dropout coupling_gain dropout dtype_float32 hand_silu hand_split mode_train norm norm:layer sum_term
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.g0 = torch.nn.Parameter(1.0 + torch.randn(16) * 0.1)
        self.w0 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.bn0 = torch.nn.BatchNorm1d(8)
        self.w1 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.w2 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)

    def forward(self, x):
        v1 = torch.relu(x)
        v2 = F.selu(v1)
        v2.sigmoid_()
        v3 = F.layer_norm(x, (16,), self.g0, self.g0)
        v4 = F.mish(v3, inplace=True)
        v5 = F.elu(x)
        v6 = F.elu(v4)
        v7 = F.dropout(v6, 0.2, True)
        v8 = torch.sigmoid(v6)
        v9 = v6 * v8
        v10, v11 = torch.chunk(v4, 2, dim=-1)
        v12 = F.linear(v11, self.w0)
        v13 = (F.elu(v12)) * 30.0
        v14 = v10 + v13
        v15 = F.linear(self.bn0(v14), self.w0)
        v16 = F.dropout(F.relu6(v15), p=0.25, training=self.training)
        v17 = v11 + v16
        v18 = torch.cat([v14, v17], dim=-1)
        v19, v20 = torch.chunk(v18, 2, dim=-1)
        v21 = v20 * torch.sigmoid(F.linear(v20, self.w1))
        v22 = F.gelu(v21, approximate='tanh')
        v23 = v19 + v22
        v24 = F.linear(v23, self.w2)
        v25 = F.gelu(v24)
        v26 = v20 + v25
        v27 = torch.cat([v23, v26], dim=-1)
        return v27 + v5.sum() * 0.1 + v7.sum() * 0.0 + v8.sum() * 0.1 + v9


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(941003)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 16, dtype=torch.float32),)

