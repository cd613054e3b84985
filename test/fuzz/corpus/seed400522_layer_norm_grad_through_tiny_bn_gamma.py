# Fuzzer finding (long-fuzz seed 400522, 2026-11-24, the first long run with norms): a LayerNorm
# feeding a BatchNorm whose gammas are 0 or ~0.05; the LayerNorm gamma's gradient is ~1e-6 and
# eager fp32 has only two digits of it (1.6e-2 from fp64); memslim.fx.optimize (LayerNorm keeping
# its output) is 5.8e-3 from eager, as near fp64 as eager, fp64 twins 1e-15 apart. The judge
# called it wrong@fx (memslim must be within 1e-3 of eager); now within max(1e-3, 4x eager's own
# error): fp32-rounding.
# memslim differential fuzzer program (test/fuzz/gen.py), seed 400522
# features: act:celu_ act:mish act:relu_ act:sigmoid act_inplace act_module dtype_float32 hand_gelu hand_mish hand_split if_training linear mode_train nn_linear norm norm:batch norm:layer pw_unary sum_term tuple_return view_reshape
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(8, 16, bias=True)
        self.act0 = torch.nn.Sigmoid()
        self.norm0 = torch.nn.LayerNorm(4, bias=False)
        self.rm0 = torch.nn.Buffer(torch.randn(4) * 0.1)
        self.rv0 = torch.nn.Buffer(torch.rand(4) + 0.5)
        self.g0 = torch.nn.Parameter(torch.where(torch.rand(4) < 0.3, torch.zeros(4), torch.randn(4) * 0.05))
        self.w0 = torch.nn.Parameter(torch.randn(24, 4) * 0.5000)

    def forward(self, x):
        v1 = self.lin0(x)
        v2 = v1.reshape(32, 4)
        v3 = v2 * torch.tanh(F.softplus(v2))
        v4 = v3.reshape(8, 16)
        if self.training:
            v5 = 1.0 + torch.erf(x * 0.7071067811865476)
            v6 = 0.5 * x * v5
            v7 = v2.pow(2)
            v10 = v7
        else:
            v3.relu_()
            v8 = self.act0(x)
            v9 = v2 + 0.5
            v10 = v9
        F.celu(v10, alpha=0.5, inplace=True)
        v11 = F.mish(v2)
        v12 = self.norm0(v3)
        v13 = F.batch_norm(v12, self.rm0, self.rv0, self.g0, self.g0, training=self.training)
        v14 = F.linear(v11, self.w0)
        v15 = v13.view(16, 8)
        return v14 + v4.sum() * 0.1, v15


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(400522)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 8, dtype=torch.float32),)

