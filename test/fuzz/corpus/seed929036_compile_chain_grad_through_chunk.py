# memslim differential fuzzer program (test/fuzz/gen.py), seed 929036: under memslim.compile
# (MEMSLIM_FUZZ_COMPILE_BUDGET=none) the graph is split around its coupling chain; v11 and v13
# come from a chunk made before the chain and are read after it. make_fx values carry no
# requires_grad and the split propagated it through tensor values only, not chunk's list:
# the piece after the chain was compiled as if v11 / v13 needed no gradient (w2 0.16 off).
# features: act:mish act:relu_ act:silu act_inplace coupling coupling_affine coupling_gain dtype_float32 if_attr linear matmul mode_train pw_binary pw_unary sum_term view_chunk
import math

import torch
import torch.nn.functional as F


class P(torch.nn.Module):
    def __init__(self, flag0: bool):
        super().__init__()
        self.flag0 = flag0
        self.w0 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.w1 = torch.nn.Parameter(torch.randn(16, 16) * 0.2500)
        self.b1 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.w3 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w4 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w5 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)
        self.w6 = torch.nn.Parameter(torch.randn(4, 4) * 0.5000)

    def forward(self, x, y):
        v2 = F.linear(x, self.w0, self.b0)
        v3 = F.linear(v2, self.w1, self.b1)
        v4 = x @ self.w2.t()
        v5 = F.mish(v4)
        v6 = F.silu(v4)
        if self.flag0:
            v7 = v5 + 0.5
            v10 = v7
        else:
            v8 = v6 * v5
            v9 = torch.relu_(v3)
            v10 = v9
        v11, v12 = v6.chunk(2, dim=1)
        v13 = torch.log1p(v12.abs())
        v14, v15 = torch.chunk(v12, 2, dim=-1)
        v16 = v15 * torch.sigmoid(F.linear(v15, self.w3))
        v17 = F.elu(v16, alpha=0.5)
        v18 = v14 + v17
        v19 = F.linear(F.layer_norm(v18, (4,)), self.w4)
        v20 = v19.sigmoid()
        v21 = v15 + v20
        v22 = torch.cat([v18, v21], dim=-1)
        v23, v24 = torch.chunk(v22, 2, dim=-1)
        v25 = F.linear(F.layer_norm(v24, (4,)), self.w5)
        v26 = torch.tanh(v25)
        v27 = v23 + v26
        v28 = F.linear(F.layer_norm(v27, (4,)), self.w4)
        v29 = (F.relu(v28)) * 30.0
        v30 = v24 * torch.exp(torch.tanh(v29)) + torch.tanh(v29)
        v31 = torch.cat([v27, v30], dim=-1)
        v32, v33 = torch.chunk(v31, 2, dim=-1)
        v34 = F.linear(F.layer_norm(v33, (4,)), self.w6)
        v35 = v34.relu()
        v36 = (v32 + v35) * torch.sigmoid(v35 + 2.0)
        v37 = F.linear(F.layer_norm(v36, (4,)), self.w3)
        v38 = F.selu(v37)
        v39 = v33 + v38
        v40 = torch.cat([v36, v39], dim=-1)
        return v40 + v10.sum() * 0.0 + v11.mean() + v13


def make():
    """(module, example inputs) for this program; deterministic."""
    torch.manual_seed(929036)
    m = P(True).to(torch.float32)
    m.train()
    return m, (torch.randn(8, 24, dtype=torch.float32), torch.randn(8, 8, dtype=torch.float32))

