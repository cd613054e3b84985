"""memslim::rotate_half and the fuse-rotate-half pass.

What: the op against aten's cat([-x[.., s:], x[.., :s]], d) (values and gradients bit for
bit; odd sizes, negative and out-of-range splits as slice clamps them, NaN / inf,
fp64 / fp32 / bf16; gradcheck and gradgradcheck; opcheck, dynamic shapes included); a
transformers-style RoPE attention traced through memslim.optimize: every rotate_half
rewritten, its gradients eager's, and from the executor's second call on it keeps what
eager keeps, where the unrewritten scripted module keeps the cat's list (the regression
this pass exists for).
Why: TorchScript's profiling executor differentiates `q * cos + rotate_half(q) * sin` as
one DifferentiableGraph whose backward keeps rotate_half's tensor list (a slice of q and
neg's output); the suite's llama_small kept 0.638x eager's bytes through TorchScript
instead of export's 0.553x.
"""

import pytest
import torch
import torch.nn.functional as F

import memslim

op = torch.ops.memslim.rotate_half


def aten_rotate_half(x, dim, split):
    d = dim % x.dim()
    hi = x[(slice(None),) * d + (slice(split, None),)]
    lo = x[(slice(None),) * d + (slice(None, split),)]
    return torch.cat([-hi, lo], dim)


CASES = [
    ((2, 3, 8), -1, 4),
    ((2, 3, 7), -1, 3),
    ((2, 6, 5), 1, 2),
    ((4, 5), -1, -2),
    ((4, 5), 1, 9),
    ((4, 5), 0, 0),
    ((3, 0, 4), -1, 2),
]


@pytest.mark.parametrize("shape,dim,split", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_op_matches_aten(shape, dim, split, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype)
    if x.numel() > 2:
        x.view(-1)[0], x.view(-1)[1], x.view(-1)[-1] = float("nan"), float("inf"), -float("inf")
    x.requires_grad_()
    got, ref = op(x, dim, split), aten_rotate_half(x, dim, split)
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    seed = torch.randn(ref.shape, generator=gen).to(dtype)
    (a,), (b,) = torch.autograd.grad(got, x, seed), torch.autograd.grad(ref, x, seed)
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_gradcheck_and_double_backward():
    x = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: op(t, -1, 3), (x,))
    assert torch.autograd.gradgradcheck(lambda t: op(t, -1, 3), (x,))


def test_keeps_no_tensor():
    x = torch.randn(4, 8, requires_grad=True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        op(x, -1, 4)
    assert kept == []


def test_opcheck():
    x = torch.randn(2, 4, 8, requires_grad=True)
    torch.library.opcheck(op, (x, -1, 4))
    torch.library.opcheck(op, (x, 1, 1))
    torch.library.opcheck(op, (torch.randn(3, 5, requires_grad=True), -1, 2))


def rotate_half(x):  # transformers' form (Llama, Mistral, Qwen2, Gemma)
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class RopeAttention(torch.nn.Module):
    def __init__(self, d=64, heads=4, seq=32):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.q, self.k = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)
        self.v, self.o = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        f = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        sh = (b, t, self.heads, self.hd)
        q = self.q(x).view(sh).transpose(1, 2)
        k = self.k(x).view(sh).transpose(1, 2)
        v = self.v(x).view(sh).transpose(1, 2)
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, -1))


class Decoder(torch.nn.Module):
    def __init__(self, layers=3):
        super().__init__()
        self.layers = torch.nn.ModuleList(RopeAttention() for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def kept_bytes(f, x, params):
    ps = {p.untyped_storage().data_ptr() for p in params}
    seen = {}

    def pack(t):
        seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = f(x)
    return sum(v for k, v in seen.items() if k not in ps), out


def test_traced_rope_keeps_eagers_bytes_from_the_executors_second_call():
    torch.manual_seed(0)
    model = Decoder()
    x = torch.randn(2, 32, 64, requires_grad=True)
    params = list(model.parameters())
    eager, _ = kept_bytes(model, x, params)
    traced = torch.jit.trace(model, (x,))
    plain = memslim.optimize(torch.jit.trace(model, (x,)), (x,), passes=["cleanup"])
    opt = memslim.optimize(traced, (x,))
    rewrote = [d for d in memslim.report(opt) if d.pass_ == "fuse-rotate-half"]
    assert len(rewrote) == 6 and all(d.verdict == "rewrote" for d in rewrote), rewrote
    figures = {}
    for name, f in (("plain", plain), ("memslim", opt)):
        for _ in range(3):  # the profiling executor's optimized graph from the 2nd call
            b, out = kept_bytes(f, x, params)
            out.square().mean().backward()
        figures[name] = b
    # Without the pass the executor's graph keeps the cat's list (the regression);
    # with it, eager's bytes.
    assert figures["plain"] > eager, figures
    assert figures["memslim"] <= eager, (figures, eager)
    ref = torch.autograd.grad(model(x).square().mean(), [x, *params])
    got = torch.autograd.grad(opt(x).square().mean(), [x, *params])
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
