# memslim differential fuzzer program (test/fuzz/gen.py), seed 929032: under memslim.compile
# (MEMSLIM_FUZZ_COMPILE_BUDGET=none) its graph holds a no_grad region (set_grad_enabled nodes)
# beside a coupling chain; the split moved nodes across the switch and split_module refused
# (AssertionError: set_grad_enabled require monotonically increasing partitions). Such
# graphs keep their chains with Inductor, with a remark (2026-11-27).
# features: act:elu coupling coupling_affine coupling_bn dropout dtype_float32 inplace_write linear mode_train no_grad norm norm:group param_0dim pw_binary sum_term tuple_return write_after_dropout
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)
        self.b0 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.s0 = torch.nn.Parameter(torch.tensor(0.41))
        self.w1 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.g0 = torch.nn.Parameter(1.0 + torch.randn(8) * 0.1)
        self.b1 = torch.nn.Parameter(torch.randn(8) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.bn0 = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        v1 = F.linear(x, self.w0, self.b0)
        v2 = F.elu(v1, alpha=0.5)
        v3 = F.dropout(v2, p=0.1, training=self.training, inplace=True)
        v3.mul_(2.0)
        v3.add_(1.0)
        v4 = F.dropout(v3, 0.5, self.training)
        v5 = v3 * self.s0
        v6 = F.linear(x, self.w1)
        v7 = F.group_norm(v6, 1, self.g0, self.b1)
        v8 = F.elu(v6)
        with torch.no_grad():
            v9 = v2 * v2
        v10, v11 = torch.chunk(v1, 2, dim=-1)
        v12 = v11 * torch.sigmoid(F.linear(v11, self.w1))
        v13 = F.hardswish(v12)
        v14 = v10 * torch.exp(torch.tanh(v13)) + torch.tanh(v13)
        v15 = F.linear(self.bn0(v14), self.w2)
        v16 = F.celu(v15, alpha=1.5)
        v17 = v11 + v16
        v18 = torch.cat([v14, v17], dim=-1)
        return v9 + v4 + v9.sum() * 0.1, v18 + v5 + v8.sum() * 0.1, v2.mean()


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(929032)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 8, dtype=torch.float32),)

