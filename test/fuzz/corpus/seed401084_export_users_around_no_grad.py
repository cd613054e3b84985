# Fuzzer finding (long-fuzz seed 401084, 2026-11-24): torch.export's graph lists `sigmoid`'s users
# as only the no_grad block (wrap_with_set_grad_enabled) although `mul` reads it too; setting mul's
# args (x * sigmoid(x) -> silu(x)) then raised SystemError inside torch.fx. memslim.fx now repairs
# the users before it rewrites.
# memslim differential fuzzer program (test/fuzz/gen.py), seed 401084
# features: act:sigmoid_ act_inplace arg_bool dtype_bfloat16 fracact hand_silu hand_split mode_train no_grad
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.s0 = torch.nn.Parameter(torch.tensor(0.33))
        self.register_buffer("consts0", torch.tensor([0.0, 1.0, 2.0]), persistent=False)

    def forward(self, x, b: bool):
        v1 = torch.sigmoid(x)
        v2 = x * v1
        v2.sigmoid_()
        with torch.no_grad():
            t3_a = torch.sigmoid(self.s0) * 1.8 + 0.1
            t3_p = torch.where(v1 > 0, v1, 1.0)
            t3_p = 1.0507 * torch.pow(t3_p, 1 - t3_a) / torch.exp(torch.lgamma(2 - t3_a))
            t3_q = torch.where(v1 <= 0, v1, 1.0)
            t3_g = torch.exp(torch.lgamma(1 + t3_a))
            t3_n = self.consts0[1]
            t3_acc = (1 - torch.exp(t3_q)) * t3_g / torch.exp(torch.lgamma(1 + t3_a))
            t3_acc = t3_acc + (1 - torch.exp(t3_q - t3_n)) * t3_g / torch.exp(torch.lgamma(t3_a)) * torch.pow(-1, t3_n)
            v3 = torch.where(v1 > 0, t3_p, 1.7581 / torch.pow(1.0, t3_a) * t3_acc)
        return v3


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(401084)
    m = P().to(torch.bfloat16)
    m.train()
    return m, (torch.randn(4, 8, dtype=torch.bfloat16), False)

