"""invertible-couplings and memslim::coupling_chain (issue 12): reversible blocks keep only
their chain's outputs, and gradients, running stats and random numbers stay eager's.

Gradients are compared in float64, where a rewrite that changed the function would show
and fp32 rounding would not hide it (the fp32 RevNet's own gradients move by ~3e-3 against
float64: bench/results/couplings.md); memory in float32.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import memslim
from memslim._models import AdditiveCoupling, RevNet, RevTransformer

warnings.filterwarnings("ignore", message=".*torch.jit.*deprecated.*")


def remarks(opt):
    return [str(d) for d in memslim.report(opt) if "invertible-couplings" in str(d)]


def step_grads(model, x, params, seed=1):
    xx = x.clone().requires_grad_()
    torch.manual_seed(seed)
    model(xx).square().sum().backward()
    out = [xx.grad] + [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out


def max_rel(a, b):
    return max(float((p - q).abs().max() / q.abs().max().clamp_min(1e-300)) for p, q in zip(a, b))


def pair(make, x, **policy):
    """(eager model, optimized module, the optimized module's parameters)."""
    torch.manual_seed(0)
    ref = make()
    torch.manual_seed(0)
    base = make()
    opt = memslim.optimize(base, (x,), **policy)
    return ref, opt, base


def small_revnet():
    return RevNet(widths=(8, 16, 32), blocks=(3, 3, 3)).double()


def test_revnet_gradients_and_running_stats_match_eager_fp64():
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    ref, opt, base = pair(small_revnet, x)
    rs = remarks(opt)
    assert sum("3 additive couplings -> memslim::coupling_chain" in r for r in rs) == 3, rs
    assert "memslim::coupling_chain" in str(opt.graph)
    for seed in range(3):  # the first call measures drift, later ones do not
        ga = step_grads(ref, x, list(ref.parameters()), seed)
        gb = step_grads(opt, x, list(base.parameters()), seed)
        assert max_rel(gb, ga) < 1e-9
    # Running stats moved once per step, as eager's (replays touch copies).
    for (n, a), b in zip(ref.named_buffers(), base.buffers()):
        assert torch.allclose(a.double(), b.double(), rtol=1e-12, atol=1e-12), n
    # Eval mode (running statistics) and no-grad calls take the plain path.
    ref.eval()
    opt.eval()
    with torch.no_grad():
        torch.testing.assert_close(opt(x), ref(x), rtol=1e-12, atol=1e-12)


def test_revnet_18_couplings_saves_under_a_fifth():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    ref, opt, _ = pair(lambda: RevNet(widths=(16, 32, 64)), x)
    xr = x.clone().requires_grad_()
    before, after = memslim.saved_bytes(ref, xr), memslim.saved_bytes(opt, xr)
    assert after <= 0.20 * before, (before, after)


def test_reversible_transformer_replays_dropout_and_keeps_rng_stream():
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    make = lambda: RevTransformer(dim=16, heads=2, depth=3, p=0.2).double()  # noqa: E731
    ref, opt, base = pair(make, x)
    assert any("3 additive couplings -> memslim::coupling_chain" in r for r in remarks(opt))
    for seed in range(2):
        ga = step_grads(ref, x, list(ref.parameters()), seed)
        after_ref = torch.rand(4)
        gb = step_grads(opt, x, list(base.parameters()), seed)
        after_opt = torch.rand(4)
        assert max_rel(gb, ga) < 1e-9
        # Backward's replays put the generator back: the user's stream goes on as in eager.
        assert torch.equal(after_ref, after_opt)
    xr = x.float().clone().requires_grad_()
    saved_ref = memslim.saved_bytes(ref.float(), xr)
    saved_opt = memslim.saved_bytes(memslim.optimize(make().float(), (x.float(),)), xr)
    assert saved_opt <= 0.20 * saved_ref, (saved_ref, saved_opt)


@pytest.mark.parametrize("form", ["affine", "glow"])
def test_affine_revnet_gradients_and_running_stats_match_eager_fp64(form):
    """RealNVP's x1 * exp(tanh(s)) + t and Glow's (x1 + t) * sigmoid(s + 2), with BatchNorm
    in F and G: one op per stage, eager's gradients and running stats."""
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    make = lambda: RevNet(widths=(8, 16, 32), blocks=(3, 3, 3), coupling=form).double()  # noqa
    ref, opt, base = pair(make, x)
    rs = remarks(opt)
    assert sum("3 affine couplings -> memslim::coupling_chain" in r for r in rs) == 3, rs
    # The combining muls and adds went into the op with F and G.
    kinds = [
        n.kind()
        for k in ("aten::sigmoid", "aten::exp", "aten::mul")
        for n in opt.graph.findAllNodes(k)
        if n.output().type().kind() == "TensorType"
    ]
    assert len(opt.graph.findAllNodes("memslim::coupling_chain")) == 3 and not kinds, kinds
    for seed in range(3):
        ga = step_grads(ref, x, list(ref.parameters()), seed)
        gb = step_grads(opt, x, list(base.parameters()), seed)
        assert max_rel(gb, ga) < 1e-9
    for (n, a), b in zip(ref.named_buffers(), base.buffers()):
        assert torch.allclose(a.double(), b.double(), rtol=1e-12, atol=1e-12), n
    ref.eval()
    opt.eval()
    with torch.no_grad():
        torch.testing.assert_close(opt(x), ref(x), rtol=0, atol=0)


def test_affine_revnet_saves_under_a_fifth():
    x = torch.randn(2, 3, 32, 32)
    ref, opt, _ = pair(lambda: RevNet(widths=(16, 32, 64), coupling="affine"), x)
    xr = x.clone().requires_grad_()
    before, after = memslim.saved_bytes(ref, xr), memslim.saved_bytes(opt, xr)
    assert after <= 0.20 * before, (before, after)


class ExpScale(torch.nn.Module):
    """An affine coupling over the last dim with linear F / G and m = exp(tanh(s))."""

    def __init__(self, d=8):
        super().__init__()
        self.f, self.g = torch.nn.Linear(d, 2 * d), torch.nn.Linear(d, 2 * d)

    def scale(self, s):
        return torch.exp(torch.tanh(s))

    def half(self, x, h):
        s, t = h.chunk(2, dim=-1)
        return x * self.scale(s) + t

    def forward(self, x):
        x1, x2 = x.chunk(2, dim=-1)
        y1 = self.half(x1, self.f(x2))
        return torch.cat([y1, self.half(x2, self.g(y1))], dim=-1)


class ReluScale(ExpScale):
    """m = relu(s): exact zeros, where x1 is lost (the block must keep its input)."""

    def scale(self, s):
        return torch.relu(s)


class PooledScale(ExpScale):
    """One scale per row, broadcast over the features."""

    def scale(self, s):
        return torch.exp(torch.tanh(s.mean(dim=-1, keepdim=True)))


SCALES = {"exp": ExpScale, "relu": ReluScale, "pooled": PooledScale}


@pytest.mark.parametrize("scale", ["exp", "relu", "pooled"])
def test_affine_scales_zeros_and_broadcasts_keep_eager_gradients(scale):
    torch.manual_seed(0)
    x = torch.randn(5, 16, dtype=torch.float64)
    make = lambda: torch.nn.Sequential(*[SCALES[scale]() for _ in range(3)]).double()  # noqa
    ref, opt, base = pair(make, x)
    assert any("3 affine couplings -> memslim::coupling_chain" in r for r in remarks(opt))
    for seed in range(3):
        xs = x * (seed + 1)
        ga = step_grads(ref, xs, list(ref.parameters()), seed)
        gb = step_grads(opt, xs, list(base.parameters()), seed)
        assert max_rel(gb, ga) < 1e-9, scale
    if scale == "relu":  # a zero scale: that call keeps the block's input
        xr = x.clone().requires_grad_()
        assert memslim.saved_bytes(opt, xr) > 2 * x.numel() * 8


class Stack(torch.nn.Module):
    """Couplings of small linear F / G over the last dim; `extra` says what else reads."""

    def __init__(self, n=4, d=8, extra="none", scale=1.0):
        super().__init__()
        lin = lambda: torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.Tanh())  # noqa: E731
        self.blocks = torch.nn.ModuleList(AdditiveCoupling(lin(), lin(), dim=-1) for _ in range(n))
        self.extra = extra
        self.scale = scale

    def forward(self, x):
        h = x
        for b in self.blocks:
            h = b(h)
        if self.extra == "input":  # the chain's input has another reader
            return h * x
        return h


def test_chain_input_with_another_reader_is_rewritten_and_right():
    x = torch.randn(3, 16, dtype=torch.float64)
    ref, opt, base = pair(lambda: Stack(extra="input").double(), x)
    assert any("4 additive couplings -> memslim::coupling_chain" in r for r in remarks(opt))
    ga = step_grads(ref, x, list(ref.parameters()))
    gb = step_grads(opt, x, list(base.parameters()))
    assert max_rel(gb, ga) < 1e-9


class Leaky(torch.nn.Module):
    """F's intermediate is also returned: no coupling the op could take."""

    def __init__(self):
        super().__init__()
        self.f = torch.nn.Linear(4, 4)
        self.g = torch.nn.Linear(4, 4)

    def forward(self, x):
        x1, x2 = torch.chunk(x, 2, dim=-1)
        h = self.f(x2)
        t = torch.tanh(h)
        y1 = x1 + t
        y2 = x2 + self.g(y1)
        return torch.cat([y1, y2], dim=-1), h


def test_function_value_read_outside_is_kept_with_reason():
    x = torch.randn(2, 8)
    _, opt, _ = pair(Leaky, x)
    rs = remarks(opt)
    assert any("kept coupling at" in r and "also read outside it" in r for r in rs), rs
    assert "coupling_chain" not in str(opt.graph)


class Amplified(torch.nn.Module):
    """F(x2) ~ 1e8: x1 = y1 - F(x2) loses x1 to cancellation in float32."""

    def __init__(self):
        super().__init__()
        self.f = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
        )
        self.g = torch.nn.Linear(4, 4)

    def forward(self, x):
        x1, x2 = torch.chunk(x, 2, dim=-1)
        y1 = x1 + torch.tanh(self.f(x2)) * 1e8
        y2 = x2 + self.g(y1) * 1e-8
        return torch.cat([y1, y2], dim=-1)


def test_drift_over_the_bound_keeps_the_exact_input():
    x = torch.randn(4, 8)
    ref, opt, base = pair(Amplified, x)
    assert any("coupling_chain" in r for r in remarks(opt))
    # Its bytes: block 0's two halves, one storage (x, 4 x 8 floats).
    with pytest.warns(UserWarning, match=r"keeps its exact input \(128 B\) from now on"):
        gb = step_grads(opt, x, list(base.parameters()))
    ga = step_grads(ref, x, list(ref.parameters()))
    # With the exact input kept, backward is eager's computation.
    assert max_rel(gb, ga) < 1e-5
    gb = step_grads(opt, x, list(base.parameters()))  # later calls: no new warning needed
    assert max_rel(gb, ga) < 1e-5


def test_anchor_every_k_blocks_keeps_those_inputs():
    x = torch.randn(16, 64)
    xr = x.clone().requires_grad_()
    kept = {}
    for k in (0, 2):
        _, opt, _ = pair(lambda: Stack(n=6, d=32), x, coupling_anchor_every=k)
        kept[k] = memslim.saved_bytes(opt, xr)
    # Blocks 2 and 4 keep their two 16 x 32 float inputs.
    assert kept[2] - kept[0] == 2 * 2 * 16 * 32 * 4, kept


def test_gradient_accumulation_over_two_forwards():
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    ref, opt, base = pair(small_revnet, x)
    for model in (ref, opt):
        torch.manual_seed(3)
        loss = model(x.requires_grad_()).square().sum() + model(x * 0.5).square().sum()
        loss.backward()  # the second forward moved the running stats in place in between
    for a, b in zip(ref.parameters(), base.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12)


def test_policy_rejects_bad_coupling_options():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="coupling_drift_bound must be"):
        memslim.optimize(Stack(), (x,), coupling_drift_bound=0.0)
    with pytest.raises(ValueError, match="coupling_anchor_every must be"):
        memslim.optimize(Stack(), (x,), coupling_anchor_every=-1)


def test_op_rejects_malformed_arguments():
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError, match="an F and a G per block"):
        torch.ops.memslim.coupling_chain(
            x, x, [], ["graph(%x : Tensor):\n  return (%x)\n"], [0], []
        )
    with pytest.raises(RuntimeError, match="cannot parse function 0"):
        torch.ops.memslim.coupling_chain(x, x, [], ["nonsense", "nonsense"], [0, 0], [])


def test_opcheck():
    """torch.library.opcheck: schema, autograd registration, fake tensors and AOT dispatch
    with dynamic shapes (two linked blocks of linear -> tanh)."""
    fn = (
        "graph(%x : Tensor, %w : Tensor):\n  %n : NoneType = prim::Constant()\n"
        "  %h : Tensor = aten::linear(%x, %w, %n)\n  %y : Tensor = aten::tanh(%h)\n  return (%y)\n"
    )
    torch.manual_seed(0)
    x1, x2 = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    ws = [torch.randn(4, 4, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    torch.library.opcheck(
        torch.ops.memslim.coupling_chain.default,
        (x1, x2, ws, [fn] * 4, [1] * 4, [0, 0, 0], 0, 1e-5),
    )
    # Affine halves: functions return (m, t) = (exp(tanh(h)), h); combine codes 1 and 2.
    aff = (
        "graph(%x : Tensor, %w : Tensor):\n  %n : NoneType = prim::Constant()\n"
        "  %h : Tensor = aten::linear(%x, %w, %n)\n  %s : Tensor = aten::tanh(%h)\n"
        "  %m : Tensor = aten::exp(%s)\n  return (%m, %h)\n"
    )
    torch.library.opcheck(
        torch.ops.memslim.coupling_chain.default,
        (x1, x2, ws, [aff] * 4, [1] * 4, [0, 0, 0], 0, 1e-5, [1, 2, 2, 1]),
    )


def test_first_call_on_fake_tensors_leaves_the_drift_check_to_the_first_real_call():
    """A chain first called on fake tensors (torch.compile's tracing) cannot measure drift
    there; the first call with real data does (here: F amplified 1e8, so the check fires)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    f = (
        "graph(%x : Tensor, %w : Tensor):\n  %n : NoneType = prim::Constant()\n"
        "  %c : float = prim::Constant[value=123456789.0]()\n"
        "  %h : Tensor = aten::linear(%x, %w, %n)\n  %t : Tensor = aten::tanh(%h)\n"
        "  %y : Tensor = aten::mul(%t, %c)\n  return (%y)\n"
    )
    g = (
        "graph(%x : Tensor, %w : Tensor):\n  %n : NoneType = prim::Constant()\n"
        "  %c : float = prim::Constant[value=1.25e-8]()\n"
        "  %h : Tensor = aten::linear(%x, %w, %n)\n  %y : Tensor = aten::mul(%h, %c)\n"
        "  return (%y)\n"
    )
    torch.manual_seed(0)
    real = [torch.randn(4, 8, requires_grad=True) for _ in range(2)] + [
        torch.randn(8, 8, requires_grad=True) for _ in range(2)
    ]
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t).requires_grad_() for t in real]
        y1, y2 = torch.ops.memslim.coupling_chain(fake[0], fake[1], fake[2:], [f, g], [1, 1], [])
        (y1.sum() + y2.sum()).backward()
    # (The check's warning goes to stderr from a direct op call.) With the drifting block's
    # input kept, the gradients are eager's; rebuilt, x1 would be off by ~30 relative.
    y1, y2 = torch.ops.memslim.coupling_chain(real[0], real[1], real[2:], [f, g], [1, 1], [])
    got = torch.autograd.grad(y1.square().sum() + y2.sum(), real)
    x1, x2, wf, wg = real
    e1 = x1 + torch.tanh(torch.nn.functional.linear(x2, wf)) * 123456789.0
    e2 = x2 + torch.nn.functional.linear(e1, wg) * 1.25e-8
    want = torch.autograd.grad(e1.square().sum() + e2.sum(), real)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


# --- memcnn's way of writing a RevNet (issue 45): F and G are BasicBlockSubs (BN, in-place
# ReLU, conv), each coupling sits in a wrapper whose forward takes *xin (TorchScript cannot
# compile it: memslim.optimize traces), x1 and x2 are made contiguous after the chunk, and a
# stage ends in a downsampling block that adds its shortcut in place (`out += residual`).


class MemcnnSub(torch.nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.bn1 = torch.nn.BatchNorm2d(cin)
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        return self.conv2(self.relu(self.bn2(self.conv1(self.relu(self.bn1(x))))))


class MemcnnCoupling(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.Fm, self.Gm = MemcnnSub(c // 2, c // 2), MemcnnSub(c // 2, c // 2)

    def forward(self, x):
        x1, x2 = torch.chunk(x, 2, dim=1)
        x1, x2 = x1.contiguous(), x2.contiguous()
        y1 = x1 + self.Fm(x2)
        y2 = x2 + self.Gm(y1)
        return torch.cat([y1, y2], dim=1)


class VarArgsWrapper(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def forward(self, *xin):
        return self._fn(*xin)


class MemcnnDown(torch.nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.sub = MemcnnSub(cin, cout, 2)
        self.downsample = torch.nn.Sequential(
            torch.nn.Conv2d(cin, cout, 1, 2, bias=False), torch.nn.BatchNorm2d(cout)
        )

    def forward(self, x):
        out = self.sub(x)
        out += self.downsample(x)
        return out


class MemcnnRevNet(torch.nn.Module):
    def __init__(self, wrap=True, widths=(8, 16), blocks=(3, 2)):
        super().__init__()
        w = widths
        block = (lambda c: VarArgsWrapper(MemcnnCoupling(c))) if wrap else MemcnnCoupling
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, w[0], 3, 1, 1, bias=False),
            torch.nn.BatchNorm2d(w[0]),
            torch.nn.ReLU(),
        )
        self.stage1 = torch.nn.Sequential(*[block(w[0]) for _ in range(blocks[0])])
        self.down = MemcnnDown(w[0], w[1])
        self.stage2 = torch.nn.Sequential(*[block(w[1]) for _ in range(blocks[1])])
        self.fc = torch.nn.Linear(w[1], 10)

    def forward(self, x):
        # (No BatchNorm before the head: it would zero the shortcut BN's bias gradient,
        # leaving rounding noise to compare.)
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.fc(torch.relu(x).mean((2, 3)))


@pytest.mark.parametrize("wrap", [True, False], ids=["traced", "scripted"])
def test_memcnn_style_revnet_chains_every_coupling_fp64(wrap):
    """Every coupling in one chain per stage: BatchNorm's running-stat and
    num_batches_tracked writes belong to the module and the downsampling block's
    `out += residual` writes a tensor a conv made (neither is a hazard to the chain);
    gradients eager's, running stats moved once per step (replays touch copies)."""
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    ref, opt, base = pair(lambda: MemcnnRevNet(wrap).double(), x)
    rs = remarks(opt)
    assert any("3 additive couplings -> memslim::coupling_chain" in r for r in rs), rs
    assert any("2 additive couplings -> memslim::coupling_chain" in r for r in rs), rs
    assert not any("kept coupling" in r for r in rs), rs
    for seed in range(2):
        ga = step_grads(ref, x, list(ref.parameters()), seed)
        gb = step_grads(opt, x, list(base.parameters()), seed)
        assert max_rel(gb, ga) < 1e-9
    for (n, a), b in zip(ref.named_buffers(), base.buffers()):
        assert (
            torch.equal(a, b)
            if n.endswith("num_batches_tracked")
            else torch.allclose(a, b, rtol=1e-12, atol=1e-12)
        ), n
    assert int(dict(base.named_buffers())["stem.1.num_batches_tracked"]) == 2


def test_memcnn_style_revnet_fp32_gradients_and_bytes():
    x = torch.randn(4, 3, 16, 16)
    ref, opt, base = pair(MemcnnRevNet, x)
    ga = step_grads(ref, x, list(ref.parameters()))
    gb = step_grads(opt, x, list(base.parameters()))
    assert max_rel(gb, ga) < 1e-4
    xr = x.clone().requires_grad_()
    assert memslim.saved_bytes(opt, xr) < 0.35 * memslim.saved_bytes(ref, xr)  # 28.7%


# Pair modules: F and G in a block whose forward takes and returns the two halves
# (`a = a + f(b); b = b + g(a); return a, b`), stacked in a loop. Scripted and inlined, each
# block's return is a TupleConstruct that the next block's call unpacks.


class PairFn(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class PairBlock(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.f, self.g = PairFn(d), PairFn(d)

    def forward(self, a, b):
        a = a + self.f(b)
        b = b + self.g(a)
        return a, b


class PairRevNet(torch.nn.Module):
    def __init__(self, d=64, depth=4):
        super().__init__()
        self.inp = torch.nn.Linear(d, 2 * d)
        self.blocks = torch.nn.ModuleList([PairBlock(d) for _ in range(depth)])
        self.head = torch.nn.Linear(2 * d, 10)

    def forward(self, x):
        a, b = self.inp(x).chunk(2, dim=-1)
        for blk in self.blocks:
            a, b = blk(a, b)
        return self.head(torch.cat([a, b], dim=-1))


def test_pair_module_revnet_is_one_chain_through_the_tuples():
    """The tuples between pair modules hand on the same two values: one chain of 4
    couplings, no tuple inside it; gradients eager's (fp64 1e-9, fp32 1e-4)."""
    x = torch.randn(16, 64, dtype=torch.float64)
    ref, opt, base = pair(lambda: PairRevNet().double(), x)
    rs = remarks(opt)
    assert rs == [r for r in rs if "4 additive couplings -> memslim::coupling_chain" in r], rs
    assert len(rs) == 1, rs
    # Only the last block's tuple is left, after the chain (it packs the op's outputs).
    assert len(opt.graph.findAllNodes("prim::TupleConstruct")) == 1
    for seed in range(2):
        ga = step_grads(ref, x, list(ref.parameters()), seed)
        gb = step_grads(opt, x, list(base.parameters()), seed)
        assert max_rel(gb, ga) < 1e-9
    x = x.float()
    ref, opt, base = pair(PairRevNet, x)
    ga = step_grads(ref, x, list(ref.parameters()))
    gb = step_grads(opt, x, list(base.parameters()))
    assert max_rel(gb, ga) < 1e-4


@pytest.mark.parametrize("adapter", ["additive", "sigmoid", "naive"])
def test_memcnn_couplings_as_shipped_chain_with_the_wrapper_off(adapter):
    """memcnn 1.5.2's own AdditiveCoupling / AffineCoupling (chunk, .contiguous(), cat; the
    affine adapters' (scale, shift)) inside InvertibleModuleWrapper(disable=True) (traced:
    its forward takes *xin): 3 couplings, one chain, gradients eager's."""
    memcnn = pytest.importorskip("memcnn")

    def fn(c, o=1):
        return torch.nn.Sequential(
            torch.nn.Conv2d(c, c, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(c, o * c, 3, padding=1),
        )

    def coupling(c):
        if adapter == "additive":
            return memcnn.AdditiveCoupling(Fm=fn(c), Gm=fn(c))
        if adapter == "sigmoid":
            a = memcnn.AffineAdapterSigmoid
            return memcnn.AffineCoupling(Fm=fn(c, 2), Gm=fn(c, 2), adapter=a)
        return memcnn.AffineCoupling(Fm=fn(c), Gm=fn(c), adapter=memcnn.AffineAdapterNaive)

    def make():
        blocks = [memcnn.InvertibleModuleWrapper(coupling(8), disable=True) for _ in range(3)]
        return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), *blocks).double()

    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref, opt, base = pair(make, x)
    kind = "additive" if adapter == "additive" else "affine"
    rs = remarks(opt)
    assert len(rs) == 1 and f"3 {kind} couplings -> memslim::coupling_chain" in rs[0], rs
    ga = step_grads(ref, x, list(ref.parameters()))
    gb = step_grads(opt, x, list(base.parameters()))
    assert max_rel(gb, ga) < 1e-9
