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
