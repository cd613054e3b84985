# Fuzzer finding (quick seed 256, 2026-11-24, the first run with norms): s0 reaches the loss
# only through group_norm's input, whose gradient sums to zero over each group, so grad s0 is
# rounding noise (fp64: 1e-13; eager fp32: -7.3e-6; memslim.fx fp32 with memslim::group_norm:
# 0.0). The judge called it wrong@fx (relative error 6); now it judges such noise in absolute
# terms against the fp64 twins (runner.fp64_twin_same): fp32-rounding, not wrong.
# memslim differential fuzzer program (test/fuzz/gen.py), seed 256
# features: act:elu act:gelu dropout dtype_float32 inplace_slice inplace_write loop loop_carried mode_train nn_linear norm norm:group param_0dim sum_term write_after_dropout
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(8, 16, bias=False)
        self.s0 = torch.nn.Parameter(torch.tensor(0.42))

    def forward(self, x):
        v1 = self.lin0(x)
        v1.div_(2.0)
        v2 = v1 + torch.sigmoid(self.s0)
        v3 = x
        for i in range(3):
            v3 = v3
        v4 = F.group_norm(v2, 1)
        v1[:, :4].add_(1.0)
        v5 = F.gelu(v4)
        v6 = F.dropout(v5, p=0.5, training=self.training, inplace=True)
        v6.clamp_(-3.0, 3.0)
        v7 = F.elu(v6)
        return v7 + v3.sum() * 0.0 + v5 + v7.sum() * 0.1


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(256)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 8, dtype=torch.float32),)

