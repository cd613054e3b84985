"""memslim.inductor_guards: the post-grad pass that keeps Inductor's own patterns from
changing a result in the graphs memslim's backend compiles.

torch 2.14.1's add(mm, c) -> addmm pattern ignores add's alpha (plain torch.compile
computes torch.add(x @ w, x, alpha=0.5) as x @ w + x); fuzz seed 930021 hit it through the
coupling-chain split. These tests hold the rewrite to: only adds with a non-unit alpha
that read an mm, the same values, a FakeTensor value on the new node, and, end to end,
memslim.compile's outputs and gradients as eager's, with a user's own post-grad pass
still run.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import memslim
from memslim import inductor_guards

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
aten = torch.ops.aten


def _program(x, w, y):
    a = torch.add(x @ w, x, alpha=0.5)  # mm first: rewritten
    b = torch.add(y, x @ w, alpha=2.0)  # mm second: rewritten
    c = torch.add(x, y, alpha=0.5)  # no mm: left (Inductor's fma on GPU)
    d = torch.add(x @ w, y)  # unit alpha: left
    e = torch.add(x @ w, y @ w, alpha=0.25)  # both mm: rewritten
    return a, b, c, d, e


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(8, 8), torch.randn(4, 8)


def _alphas(gm):
    return sorted(
        n.kwargs.get("alpha", 1)
        for n in gm.graph.find_nodes(op="call_function", target=aten.add.Tensor)
    )


@pytest.mark.parametrize("tracing_mode", ["real", "fake"])
def test_rewrites_only_adds_with_alpha_that_read_an_mm(tracing_mode):
    args = _inputs()
    gm = make_fx(_program, tracing_mode=tracing_mode)(*args)
    assert _alphas(gm) == [0.25, 0.5, 0.5, 1, 2.0]
    want = _program(*args)
    assert inductor_guards.scale_add_alpha(gm.graph) == 3
    gm.graph.lint()
    gm.recompile()
    assert _alphas(gm) == [0.5, 1, 1, 1, 1]
    muls = list(gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor))
    assert sorted(m.args[1] for m in muls) == [0.25, 0.5, 2.0]
    if tracing_mode == "fake":  # later passes read the new node's value
        assert all(m.meta["val"].shape == (4, 8) for m in muls)
    for got, exp in zip(gm(*args), want):
        torch.testing.assert_close(got, exp, rtol=1e-6, atol=1e-6)


class _AddAlpha(torch.nn.Module):
    def __init__(self, mm_first):
        super().__init__()
        self.mm_first = mm_first
        self.w = torch.nn.Parameter(torch.randn(8, 8) * 0.35)

    def forward(self, x):
        mm = x @ self.w
        y = torch.add(mm, x, alpha=0.5) if self.mm_first else torch.add(x, mm, alpha=0.5)
        return torch.tanh(y)


class _Counting:
    """A user's post-grad pass (a CustomGraphPass, so Inductor's caches stay on)."""

    def __init__(self):
        from torch._inductor.custom_graph_pass import CustomGraphPass

        calls = self.calls = []

        class Count(CustomGraphPass):
            def __call__(self, graph):
                calls.append(len(graph.nodes))

            def uuid(self):
                return ("memslim-test-count", 1)

        self.pass_ = Count()


@pytest.mark.parametrize("mm_first", [True, False])
def test_compile_keeps_eager_results_beside_the_addmm_pattern(mm_first):
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    torch.manual_seed(0)
    model = _AddAlpha(mm_first)
    x = torch.randn(4, 8)
    want = model(x)
    want.sum().backward()
    want_grad = model.w.grad.clone()
    model.w.grad = None
    user = _Counting()
    torch._dynamo.reset()
    # Cold, so that the post-grad passes run (a cache hit skips them).
    with (
        inductor_config.patch(fx_graph_cache=False, post_grad_custom_pre_pass=user.pass_),
        functorch_config.patch(enable_autograd_cache=False),
    ):
        compiled = memslim.compile(model, strict=True)
        got = compiled(x)
        got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.w.grad, want_grad, rtol=1e-5, atol=1e-5)
    assert len(user.calls) == 2  # the user's pass still runs, on forward and backward


# Fuzz seed 940132 (2026-11-29): under fallback_random (the fuzz judge's and torch's accuracy
# runs' eager RNG), a dropout whose result is unused still draws its mask in eager; torch
# 2.14.1 chains the random ops (control_deps) for Inductor's scheduler, but the edge to
# native_dropout points at its two outputs, which the scheduler removes as dead, and with them
# the edge: the next dropout's bernoulli_ may then draw first (a fusion moved the dead
# dropout's input after it). Plain torch.compile too (the strict xfail below).
class _DeadDropout(torch.nn.Module):
    def forward(self, x, y):
        a = torch.erf(x) * 0.5
        F.dropout(a, 0.5, training=True)  # unused: eager draws its mask first
        v = a * y
        F.dropout(v, 0.1, training=True, inplace=True)
        return v


class _DeadInplaceDropout(torch.nn.Module):
    def forward(self, x, y):
        a = torch.erf(x) * 0.5
        b = a * 2
        F.dropout(b, 0.5, training=True, inplace=True)  # b never read: Inductor drops the draw
        return F.dropout(a * y, 0.1, training=True)


def _dead_dropout_run(fn):
    from torch._inductor import config as inductor_config

    x, y = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.ones(64)
    torch._dynamo.reset()
    with inductor_config.patch(fallback_random=True, fx_graph_cache=False):
        torch.manual_seed(0)
        return fn(x, y)


@pytest.mark.xfail(strict=True, reason="torch 2.14.1 loses a dead dropout's draw or its order")
@pytest.mark.parametrize("model", [_DeadDropout, _DeadInplaceDropout])
def test_plain_compile_loses_a_dead_dropouts_draw(model):
    m = model()
    want = _dead_dropout_run(m)
    torch.testing.assert_close(_dead_dropout_run(torch.compile(m)), want)


@pytest.mark.parametrize("model", [_DeadDropout, _DeadInplaceDropout])
def test_compile_keeps_a_dead_dropouts_draw_first(model):
    m = model()
    want = _dead_dropout_run(m)
    torch.testing.assert_close(_dead_dropout_run(memslim.compile(m, strict=True)), want)
    y = torch.ones(64, requires_grad=True)  # and the training graph
    got = _dead_dropout_run(lambda a, _: memslim.compile(m, strict=True)(a, y))
    torch.testing.assert_close(got, want)


def _three_dropouts(x, y):
    a = torch.erf(x) * 0.5
    aten.native_dropout.default(a, 0.5, True)  # unused: becomes a draw
    v = aten.native_dropout.default(a * y, 0.1, True)  # used: left
    aten.native_dropout.default(v[0], 0.3, True)  # unused, but the last draw: left
    return v[0]


@pytest.mark.parametrize("fallback_random", [True, False])
def test_only_unused_training_dropouts_before_a_draw_become_draws(fallback_random):
    from torch._inductor import config as inductor_config

    x, y = torch.randn(64), torch.randn(64)
    gm = make_fx(_three_dropouts, tracing_mode="fake")(x, y)
    assert len(gm.graph.find_nodes(op="call_function", target=aten.native_dropout.default)) == 3
    with inductor_config.patch(fallback_random=fallback_random):
        n = inductor_guards.draw_dead_dropouts(gm.graph)
    gm.graph.lint()
    gm.recompile()
    target = torch.ops.memslim.dropout_draw.default
    draws = list(gm.graph.find_nodes(op="call_function", target=target))
    assert n == len(draws) == (1 if fallback_random else 0)
    if fallback_random:  # p as it was; its value native_dropout's keep-mask's
        assert draws[0].args[1] == 0.5 and draws[0].meta["val"].dtype == torch.bool
        torch.manual_seed(0)
        want = _three_dropouts(x, y)
        torch.manual_seed(0)
        torch.testing.assert_close(gm(x, y), want)  # the same draws, in the same order


# Saved inputs as they are: under layout optimisation (always on the CPU with mkldnn)
# Inductor returns a channels-last copy of each forward output that feeds a convolution,
# the convolution's weight among them, kept until backward (resnet18 with GELU, 8 x 3 x
# 32 x 32: 44 MB of weight copies beside 3 MB of activations, 2026-11-29).
class _TwoConvs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


def _saved_weight_copies(model, m, x):
    """(saved tensors shaped as a weight but in storages of their own, gradients)."""
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    shapes = {tuple(p.shape) for p in m.parameters() if p.dim() == 4}
    copies = []

    def pack(t):
        if tuple(t.shape) in shapes and t.untyped_storage().data_ptr() not in params:
            copies.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        grads = torch.autograd.grad(model(x).square().sum(), list(m.parameters()))
    return copies, grads


def test_plain_compile_keeps_copies_of_convolution_weights():
    m, x = _TwoConvs(), torch.randn(2, 3, 8, 8)
    torch._dynamo.reset()
    copies, _ = _saved_weight_copies(torch.compile(m), m, x)
    assert sorted(copies) == [(16, 3, 3, 3), (16, 16, 3, 3)]  # why the guard exists


@pytest.mark.parametrize("budget", [None, 0.5])
def test_compile_saves_convolution_weights_not_copies(budget):
    m, x = _TwoConvs(), torch.randn(2, 3, 8, 8)
    _, want = _saved_weight_copies(m, m, x)
    torch._dynamo.reset()
    model = memslim.compile(m, strict=True, memory_budget=budget)
    copies, got = _saved_weight_copies(model, m, x)
    assert copies == []
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_keep_inputs_as_they_are_marks_only_inputs_returned():
    gm = make_fx(lambda w, x: (x * 2, w, x), tracing_mode="fake")(torch.randn(4), torch.randn(4))
    out = gm.graph.find_nodes(op="output")[0]
    out.meta["original_output_strides"] = [(1,), (1,), (1,)]
    out.meta["user_visible_output_idxs"] = [0]
    assert inductor_guards.keep_inputs_as_they_are(gm.graph) == 2
    assert out.meta["user_visible_output_idxs"] == [0, 1, 2]
    del out.meta["user_visible_output_idxs"]  # not set by compile_fx: nothing to do
    assert inductor_guards.keep_inputs_as_they_are(gm.graph) == 0


@pytest.mark.parametrize("budget", [None, 0.5])
def test_a_users_saved_tensors_hooks_see_the_first_steps_saves(budget):
    """A hook of the user's that reads data_ptr (CPU offloading, a counter) ran on
    memslim's fake tensors while the backend traced: every graph fell back to Inductor.
    Under a budget the planning forward's own measuring hooks hid every save from the
    user's (hooks are a stack, the top one packs)."""
    m, x = _TwoConvs(), torch.randn(2, 3, 8, 8)
    torch._dynamo.reset()
    model = memslim.compile(m, strict=True, memory_budget=budget)
    for _ in range(2):  # the compiling, planning step and the next
        packed = []

        def pack(t):
            packed.append(t.untyped_storage().data_ptr())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x).sum().backward()
        assert packed  # the compiled function's saves, at run time
