"""memslim::gated_linear and the fuse-gated-mlp pass.

What: the op against aten's linear(act(g) * u) for every activation of the table (values
and gradients bit for bit in fp64 and fp32: the same aten ops recomputed), opcheck; the
pass on a hand-RMSNorm SwiGLU decoder block and a GeGLU MLP through memslim.optimize
(TorchScript) and torch.export + memslim.fx.optimize: gradients as eager's, saved bytes
(saved_tensors_hooks) at most 0.60x eager's for the decoder, the records. The GLU form
(g and u the two halves of one projection: chunk, torch.split, slices): the op on the
strided views against aten (NaN / inf included), MLPs of that form through both front
ends (loss and every gradient as eager's: fp64 within 1e-10, fp32 within 1e-5; saved
bytes below eager's by at least act(g)'s and the product's; the record names the form).
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


# The GLU form: gu = linear(x, W_gu); g, u = two halves of gu's last dim.
def _halves(gu, form, n):
    # n an int, as a model's width is (gu.shape[-1] // 2 traces as ops on the shape: the
    # slices' bounds are then no constants, and the record says "two views of").
    if form == "chunk":
        return gu.chunk(2, dim=-1)
    if form == "split":
        return torch.split(gu, n, -1)
    if form == "slice":
        return gu[..., :n], gu[..., n:]
    u, g = gu.chunk(2, dim=-1)  # "chunk_up_first"
    return g, u


@pytest.mark.parametrize("form", ["chunk", "slice", "chunk_up_first"])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "sigmoid", "relu"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_op_on_strided_halves_matches_aten(form, act, dtype):
    """g and u strided views of one tensor (chunk of the last dim): the op computes what
    aten computes, values bit for bit, gradients into gu as aten's, NaN and inf where
    aten has them."""
    f, params = ACTS[act]
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(4, 6, 48, dtype=dtype, generator=gen)
    base[0, 0, 3], base[1, 2, 30], base[2, 1, 7], base[3, 5, 40] = (
        float("nan"),
        float("inf"),
        -float("inf"),
        float("inf"),
    )
    w = torch.randn(5, 24, dtype=dtype, generator=gen)
    seed = torch.randn(4, 6, 5, dtype=dtype, generator=gen)
    outs, grads = [], []
    for use_op in (False, True):
        gu, wl = base.clone().requires_grad_(), w.clone().requires_grad_()
        g, u = _halves(gu, form, 24)
        assert not g.is_contiguous() and g.data_ptr() != u.data_ptr()
        y = op(g, u, wl, None, act, params) if use_op else F.linear(f(g) * u, wl)
        outs.append(y)
        grads.append(torch.autograd.grad(y, (gu, wl), seed))
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0, equal_nan=True)
    for got, want in zip(grads[1], grads[0]):
        assert torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


class GLUBlock(torch.nn.Module):
    """x + down(act(g) * u) with g, u the two halves of one gate_up projection (Phi-3's
    gate_up_proj, ChatGLM's dense_h_to_4h)."""

    def __init__(self, d, ff, form, act):
        super().__init__()
        self.gate_up = torch.nn.Linear(d, 2 * ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=True)
        self.form, self.act, self.ff = form, act, ff

    def forward(self, x):
        g, u = _halves(self.gate_up(x), self.form, self.ff)
        return x + self.down(ACTS[self.act][0](g) * u)


class GLUStack(torch.nn.Module):
    def __init__(self, form, act="silu", d=32, ff=40, n=2):
        super().__init__()
        self.blocks = torch.nn.ModuleList([GLUBlock(d, ff, form, act) for _ in range(n)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("way", ["torchscript", "export"])
@pytest.mark.parametrize("form", ["chunk", "split", "slice", "chunk_up_first"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_glu_form_mlp(way, form, dtype):
    torch.manual_seed(0)
    model = GLUStack(form, act="gelu_tanh" if form == "slice" else "silu").to(dtype)
    x = torch.randn(3, 7, 32, dtype=dtype)
    loss_ref = model(x.requires_grad_()).square().mean()
    loss_ref.backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters()}
    want_x = x.grad.clone()
    eager_bytes = memslim.saved_bytes(model, x.detach())
    handle, mod = _way(model, way, x.detach())
    for p in mod.parameters():
        p.grad = None
    x2 = x.detach().clone().requires_grad_()
    loss = mod(x2).square().mean()
    loss.backward()
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(loss, loss_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(x2.grad, want_x, rtol=tol, atol=tol)
    for k, p in mod.named_parameters():
        torch.testing.assert_close(p.grad, want[k], rtol=tol, atol=tol)
    # Per block act(g) and the product (3 x 7 x 40 each) are no longer kept.
    freed = eager_bytes - memslim.saved_bytes(mod, x.detach())
    assert freed >= 2 * 2 * 3 * 7 * 40 * x.element_size(), (freed, eager_bytes)
    gated = [str(d) for d in memslim.report(handle) if "fuse-gated-mlp" in str(d)]
    assert sum("rewrote" in r and "the two halves of" in r for r in gated) == 2, gated
