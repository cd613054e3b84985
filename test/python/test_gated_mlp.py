"""memslim::gated_linear and the fuse-gated-mlp pass.

What: the op against aten's linear(act(g) * u) for every activation of the table (values
and gradients bit for bit in fp64 and fp32: the same aten ops recomputed), opcheck; the
pass on a hand-RMSNorm SwiGLU decoder block and a GeGLU MLP through memslim.optimize
(TorchScript) and torch.export + memslim.fx.optimize: gradients as eager's, saved bytes
(saved_tensors_hooks) at most 0.60x eager's for the decoder, the records.
Why: a gated MLP keeps four tensors of its width where two suffice.
"""

import pytest
import torch
import torch.nn.functional as F

import memslim
import memslim.fx

op = torch.ops.memslim.gated_linear
ACTS = {
    "silu": (F.silu, []),
    "gelu": (F.gelu, []),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), []),
    "relu": (F.relu, []),
    "sigmoid": (torch.sigmoid, []),
    "tanh": (torch.tanh, []),
    "mish": (F.mish, []),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), [0.2]),
}


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_op_matches_aten(act, dtype, bias):
    f, params = ACTS[act]
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(3, 5, 24, dtype=dtype, generator=gen).requires_grad_()
    u = torch.randn(3, 5, 24, dtype=dtype, generator=gen).requires_grad_()
    w = torch.randn(7, 24, dtype=dtype, generator=gen).requires_grad_()
    b = torch.randn(7, dtype=dtype, generator=gen).requires_grad_() if bias else None
    leaves = [x for x in (g, u, w, b) if x is not None]
    ref = F.linear(f(g) * u, w, b)
    got = op(g, u, w, b, act, params)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    seed = torch.randn(ref.shape, dtype=dtype, generator=gen)
    for a, b_ in zip(
        torch.autograd.grad(got, leaves, seed), torch.autograd.grad(ref, leaves, seed)
    ):
        torch.testing.assert_close(a, b_, rtol=1e-12 if dtype == torch.float64 else 1e-6, atol=0)


def test_opcheck():
    g, u = torch.randn(4, 16, requires_grad=True), torch.randn(4, 16, requires_grad=True)
    w, b = torch.randn(8, 16, requires_grad=True), torch.randn(8, requires_grad=True)
    torch.library.opcheck(op, (g, u, w, b, "silu", []))
    torch.library.opcheck(op, (g, u, w, None, "gelu_tanh", []))


class RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + 1e-6))


class SwiGLUBlock(torch.nn.Module):
    """A decoder's MLP half, Llama's way: x + down(silu(gate(n(x))) * up(n(x)))."""

    def __init__(self, d=64, ff=172):
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate = torch.nn.Linear(d, ff, bias=False)
        self.up = torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([SwiGLUBlock() for _ in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def _way(model, way, x):
    if way == "torchscript":
        opt = memslim.optimize(model, (x,))
        return opt, opt
    ep = torch.export.export(model, (x,))
    memslim.fx.optimize(ep)
    return ep, ep.module()


@pytest.mark.parametrize("way", ["torchscript", "export"])
def test_swiglu_decoder(way):
    torch.manual_seed(0)
    model = Decoder()
    x = torch.randn(4, 32, 64)
    model(x).square().mean().backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters()}
    eager_bytes = memslim.saved_bytes(model, x)
    handle, mod = _way(model, way, x)
    for p in mod.parameters():
        p.grad = None
    mod(x).square().mean().backward()
    for k, p in mod.named_parameters():
        torch.testing.assert_close(p.grad, want[k], rtol=1e-4, atol=1e-6)
    ours = memslim.saved_bytes(mod, x)
    assert ours <= 0.60 * eager_bytes, (ours, eager_bytes)
    gated = [str(d) for d in memslim.report(handle) if "fuse-gated-mlp" in str(d)]
    assert sum("rewrote" in r for r in gated) == 3, gated


def test_autocast_casts_as_aten_linear():
    """Under torch.autocast the op casts its arguments as aten's linear does (a graph
    traced above autocast hands it float32 weights and bf16 projections)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=gen)
    wg, wu = (torch.randn(24, 16, generator=gen).requires_grad_() for _ in range(2))
    wd = torch.randn(16, 24, generator=gen).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g, u = F.linear(x, wg), F.linear(x, wu)
        ref = F.linear(F.silu(g) * u, wd)
        got = op(g, u, wd, None, "silu", [])
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    for a, b in zip(
        torch.autograd.grad(got.sum(), (wg, wu, wd), retain_graph=True),
        torch.autograd.grad(ref.sum(), (wg, wu, wd)),
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
