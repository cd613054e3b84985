# memslim differential fuzzer program (test/fuzz/gen.py), seed 941071: memslim.compile with
# memory_budget=0.5 and dynamic=True raised "AssertionError: fake_mode must not be None" (2026-11-30):
# a dry run re-partitioned a copy of a shared joint whose ladder step re-runs a random op, outside
# any fake mode or tracing context (a piece beside a coupling chain), where torch's
# functionalize_rng_ops looks one up (seed 941082 the same).
# features: act:gelu_tanh act:leaky_relu act:leaky_relu_ act:relu act:relu_ act:tanh act_inplace arg_bool arg_int coupling coupling_affine coupling_bn dropout dtype_float32 fracact hand_hardswish if_attr inplace_slice inplace_write linear method method:hand_hardswish mode_train pw_unary sum_term tuple_return write_after_dropout
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self, flag0: bool):
        super().__init__()
        self.flag0 = flag0
        self.w0 = torch.nn.Parameter(torch.randn(8, 16) * 0.2500)
        self.b0 = torch.nn.Parameter(torch.randn(8) * 0.1)
        self.w1 = torch.nn.Parameter(torch.randn(16, 16) * 0.2500)
        self.b1 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.s0 = torch.nn.Parameter(torch.tensor(0.97))
        self.w2 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.bn0 = torch.nn.BatchNorm1d(8)
        self.w3 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)

    def forward(self, x, b: bool, k: int):
        v1 = F.linear(x, self.w0, self.b0)
        v2 = F.linear(x, self.w0)
        v3 = F.linear(x, self.w1, self.b1)
        v4 = self.fn0(x)
        v5 = F.leaky_relu(v4, 0.2)
        v6 = F.dropout(v5, 0.5, self.training)
        v6.mul_(0.5)
        F.leaky_relu(v5, 0.1, inplace=True)
        if self.flag0:
            t7_a = torch.sigmoid(self.s0) * 1.8 + 0.1
            t7_p = torch.where(v4 > 0, v4, 1.0)
            t7_p = 1.0507 * torch.pow(t7_p, 1 - t7_a) / torch.exp(torch.lgamma(2 - t7_a))
            t7_q = torch.where(v4 <= 0, v4, 1.0)
            t7_g = torch.exp(torch.lgamma(1 + t7_a))
            t7_acc = (1 - torch.exp(t7_q)) * t7_g / torch.exp(torch.lgamma(1 + t7_a))
            t7_acc = t7_acc - (1 - torch.exp(t7_q - 1.0)) * t7_g / torch.exp(torch.lgamma(t7_a))
            v7 = torch.where(v4 > 0, t7_p, 1.7581 / torch.pow(1.0, t7_a) * t7_acc)
            v9 = v7
        else:
            v8 = torch.tanh(v6)
            v9 = v8
        v10 = torch.relu(v9)
        v11 = F.gelu(v9, approximate='tanh')
        v12 = F.dropout(v11, p=0.2, training=self.training, inplace=True)
        v13 = torch.log1p(v10.abs())
        v3[0].add_(1.0)
        v13.add_(v13)
        v14 = F.relu(v1, inplace=True)
        v15 = v11 * F.relu6(v11 + 3.0) / 6.0
        v16, v17 = torch.chunk(v15, 2, dim=-1)
        v18 = F.linear(self.bn0(v17), self.w2)
        v19 = F.elu(v18, alpha=0.5)
        v20 = v16 * torch.exp(torch.tanh(v19)) + torch.tanh(v19)
        v21 = F.linear(F.layer_norm(v20, (8,)), self.w3)
        v22 = F.gelu(v21)
        v23 = v17 + v22
        v24 = torch.cat([v20, v23], dim=-1)
        return v14 + v2.mean() + v12.sum() * 0.0, v24, v14.mean()

    def fn0(self, x):
        return x * F.relu6(x + 3.0) / 6.0


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(941071)
    m = P(True).to(torch.float32)
    m.train()
    return m, (torch.randn(8, 16, dtype=torch.float32), False, 0)

