# memslim differential fuzzer program (test/fuzz/gen.py), seed 941000: under memslim.compile with
# memory_budget=0.5 and dynamic=True (MEMSLIM_FUZZ_COMPILE_BUDGET=0.5,
# MEMSLIM_FUZZ_COMPILE_DYNAMIC=1) the planner, running inside the compile's partition step
# (budget.partitioner, 2026-11-30), tried torch's knapsack on the compile's own joint, whose
# size input is an int there (a SymInt in the dry runs' trace): "Unknown metadata type <class
# 'int'> on node primals_3" from torch's estimate_activations_size, the step stopped. A dry run
# that fails inside the compile now plans the old way, on a fresh trace (Retrace).
# features: act:relu6 act:sigmoid addcdiv coupling coupling_affine coupling_bn coupling_dropout dtype_float32 hand_gelu hand_silu inplace_slice inplace_write loop loop_carried matmul mode_eval nn_linear pw_unary sum_term tuple_return view_unsqueeze
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(8, 8, bias=True)
        self.w0 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.w1 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.bn0 = torch.nn.BatchNorm1d(4)
        self.w2 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w3 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)

    def forward(self, x, y):
        v2 = self.lin0(y)
        v3 = torch.sigmoid(y)
        v4 = v3 * torch.sigmoid(v3)
        v5 = y.sigmoid()
        v6 = F.relu6(v5)
        v2[:, :2].add_(1.0)
        v7 = v6 * 0.5 * (1.0 + torch.erf(v6 * 0.7071067811865476))
        v8 = v7.unsqueeze(0)
        v9 = v8.squeeze(0)
        v2.add_(v9, alpha=0.5)
        v10 = torch.exp(-v6.abs())
        v11 = torch.addcdiv(v9, y, v6.abs() + 1.0, value=0.3)
        v12 = v11
        for i in range(1):
            v13 = v12 @ self.w0.t()
            v12 = v13 + v12 * 0.5
        v14, v15 = torch.chunk(v7, 2, dim=-1)
        v16 = F.linear(self.bn0(v15), self.w1)
        v17 = F.hardsigmoid(v16)
        v18 = v14 + v17
        v19 = F.linear(v18, self.w1)
        v20 = F.gelu(v19)
        v21 = v15 * torch.exp(torch.tanh(v20)) + torch.tanh(v20)
        v22 = F.linear(F.layer_norm(v21, (4,)), self.w2)
        v23 = F.selu(v22)
        v24 = v18 + v23
        v25 = F.linear(v24, self.w3)
        v26 = F.dropout(F.relu6(v25), p=0.25, training=self.training)
        v27 = v21 * torch.exp(torch.tanh(v26)) + torch.tanh(v26)
        v28 = torch.cat([v24, v27], dim=-1)
        return v28 + v4.sum() * 0.0 + v8.sum() * 0.1 + v10.mean() + v25.sum() * 0.0,


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(941000)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 8, dtype=torch.float32), torch.randn(4, 8, dtype=torch.float32))

