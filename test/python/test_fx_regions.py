"""memslim's recompute regions in the FX front end: exported programs, torch.compile's
recompute tags (and Inductor's caches keyed by them) and the regressions review found.
Split from test_fx.py (its helpers live there) to keep each file readable."""

import pytest
import torch
import torch.nn as nn
from test_fx import _close, _grads
from test_fx_compile import _compile_pair

import memslim
import memslim.fx
from memslim.measure import saved_bytes


class FracMLP(nn.Module):
    """linear -> FracAct (the seed-000 hand-written activation: ~60 pointwise aten ops, a
    trainable 0-dim order, two 3-element buffers) -> linear."""

    def __init__(self, width=16):
        super().__init__()
        from memslim._models import FracAct

        self.a = nn.Linear(16, width)
        self.act = FracAct()
        self.b = nn.Linear(width, 4)

    def forward(self, x):
        return self.b(self.act(self.a(x)))


def _region_ops(gm):
    return [n for n in gm.graph.nodes if str(n.target) == "memslim.recompute_region.default"]


def test_exported_recompute_region_trains_like_eager_and_keeps_its_inputs():
    torch.manual_seed(0)
    model = FracMLP().train()
    x = torch.randn(32, 16)
    ep = memslim.fx.optimize(torch.export.export(model, (x,)))
    regions = [d for d in memslim.report(ep) if d.pass_ == "recompute-pointwise-regions"]
    assert [d.verdict for d in regions] == ["rewrote"], regions
    after = ep.module()
    assert len(_region_ops(after)) == 1
    # The whole formula went into the op (no FracAct op is left in the graph).
    assert not any(str(n.target).startswith("aten.lgamma") for n in after.graph.nodes)
    _close(_grads(after, x), _grads(model, x), 1e-6)
    order_grad = after.get_submodule("act").order.grad
    assert order_grad is not None and order_grad.abs() > 0
    eager, ours = saved_bytes(model, x), saved_bytes(after, x)
    assert ours < 0.3 * eager
    # The price is what autograd then keeps (the order's sigmoid aside: 4 bytes).
    assert abs((eager - ours) - regions[0].freed_bytes) <= 16


def test_region_decisions_match_between_front_ends():
    # The same region, priced alike: what its nodes keep and what its inputs cost.
    torch.manual_seed(0)
    model = FracMLP().train()
    x = torch.randn(32, 16)
    passes = ["recompute-pointwise-regions"]
    ts = memslim.report(memslim.optimize(model, (x,), passes=passes))
    fx = memslim.report(memslim.fx.optimize(torch.export.export(model, (x,)), passes=passes))
    assert [(d.verdict, d.bytes_before, d.bytes_after) for d in ts] == [
        (d.verdict, d.bytes_before, d.bytes_after) for d in fx
    ]


def test_region_with_a_later_write_to_its_input_is_kept():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 16)

        def forward(self, x):
            h = self.a(x)
            y = torch.exp(h * 2.0) * torch.sigmoid(h)
            h.add_(1.0)  # written after the region read it
            return y.sum() + h.sum()

    x = torch.randn(4, 16)
    ep = memslim.fx.optimize(
        torch.export.export(Net(), (x,)), passes=["recompute-pointwise-regions"]
    )
    (d,) = memslim.report(ep)
    assert d.verdict == "kept" and "written in place afterwards" in d.text, d.text
    assert not _region_ops(ep.module())


class TrainableSwishMLP(nn.Module):
    """linear -> a hand-written activation with a trainable 0-dim slope (x * sigmoid(b x)
    plus a bump) -> linear. (FracAct's pow(-1, n) does not compile with dynamic shapes
    even under plain torch.compile: Inductor raises a LoweringException.)"""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.beta = nn.Parameter(torch.tensor(1.3))
        self.b = nn.Linear(64, 4)

    def forward(self, x):
        h = self.a(x)
        return self.b(h * torch.sigmoid(self.beta * h) + 0.1 * torch.tanh(h) * torch.exp(-h * h))


@pytest.mark.parametrize(
    "model_fn,dynamic",
    [(lambda: FracMLP(width=64), False), (TrainableSwishMLP, False), (TrainableSwishMLP, True)],
)
def test_compile_applies_regions_as_recompute_tags(model_fn, dynamic):
    torch.manual_seed(0)
    model = model_fn().train()
    x = torch.randn(64, 16)
    plain, ours = _compile_pair(model, dynamic=dynamic)
    want = _grads(model, x)
    _close(_grads(ours, x), want, 1e-5)
    assert saved_bytes(ours, x) <= 0.85 * saved_bytes(plain, x)
    records = memslim.report(ours)
    assert any(d.pass_ == "recompute-pointwise-regions" and d.verdict == "rewrote" for d in records)
    assert "rewrites kept" in records[-1].text
    x2 = torch.randn(9, 16)
    _close(_grads(ours, x2), _grads(model, x2), 1e-5)


class TwoFracMLP(nn.Module):
    """linear -> FracAct -> linear -> FracAct, then more pointwise ops -> linear: two
    recompute regions, the second recomputing more ops than the first."""

    def __init__(self):
        super().__init__()
        from memslim._models import FracAct

        self.a, self.b, self.c = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 4)
        self.act1, self.act2 = FracAct(), FracAct()

    def forward(self, x):
        y = self.act2(self.b(self.act1(self.a(x))))
        return self.c(y * torch.sigmoid(y) * 0.5 + torch.tanh(y) * torch.exp(-y))


_CACHE_SCRIPT = r"""
import copy, sys, torch, memslim
from memslim.measure import saved_bytes
sys.path.insert(0, sys.argv[1])
from test_fx_regions import TwoFracMLP
torch._inductor.config.fx_graph_cache = True
torch._functorch.config.enable_autograd_cache = True
torch.manual_seed(0)
model = TwoFracMLP().train()
x = torch.randn(64, 16)
# max_added_work=33: only the first region is taken (the second recomputes more ops);
# then the defaults: the same aten graph (only aten ops: AOTAutograd's cache takes it)
# with both regions' nodes tagged.
one = saved_bytes(memslim.compile(copy.deepcopy(model), strict=True, max_added_work=33), x)
torch._dynamo.reset()
both = saved_bytes(memslim.compile(copy.deepcopy(model), strict=True), x)
from torch._dynamo.utils import counters
print(counters["aot_autograd"].get("autograd_cache_hit", 0), one, both)
"""


def test_compile_with_caches_on_keeps_each_policys_regions(tmp_path):
    # Inductor's FX graph cache and AOTAutograd's cache on (a fresh directory): a second
    # compile of the same model under another policy gets its own regions, not the
    # first compile's partition.
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [sys.executable, "-c", _CACHE_SCRIPT, os.path.dirname(__file__)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    hits, one, both = map(int, r.stdout.split()[-3:])
    assert hits == 0 and both <= 0.85 * one, (hits, one, both)


def test_region_tags_enter_inductors_cache_key():
    # Tags are node metadata, which the cache keys do not cover (measured 2026-11-23: a
    # hand-tagged compile served the untagged partition): the backend compiles a tagged
    # graph with a keying pass whose uuid names the tags, and Inductor's key reads it.
    from torch._inductor import config
    from torch._inductor.codecache import FxGraphHashDetails
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils.checkpoint import CheckpointPolicy
    from memslim.cache_keys import _keyed_by_tags

    def build(tagged):
        gm = make_fx(lambda x: torch.exp(torch.sin(x)) * 2)(torch.randn(4))
        for n in gm.graph.nodes:
            if n.op == "call_function" and tagged(n):
                n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
                n.meta["ac_graph_id"] = 1
        return gm

    def key(gm):
        with _keyed_by_tags(gm):
            return FxGraphHashDetails(gm, [], {}, []).joint_custom_pre_pass

    untagged = build(lambda n: False)
    sin = build(lambda n: "sin" in n.name)
    both = build(lambda n: "sin" in n.name or "exp" in n.name)
    assert key(untagged) is None and config.joint_custom_pre_pass is None
    assert key(sin) is not None and key(sin) == key(build(lambda n: "sin" in n.name))
    assert len({key(untagged), key(sin), key(both)}) == 3


def _pre_dispatch(model, x):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(model, pre_dispatch=True)(x)


class _SumUnderNoGrad(nn.Module):
    """Review finding (2026-11-24): the region's first outside reader sat inside a
    no_grad block, so the op went there and ran without grad."""

    def forward(self, x):
        a = x.sin()
        with torch.no_grad():
            s = a.sum()
        return (a.cos() * a.exp()).tanh() + s


class _ParamReadMidGraph(nn.Module):
    """Review finding (2026-11-24): make_fx's get_attr constants sit mid-graph; the view
    put them with the placeholders and the op went before one it reads."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 64))

    def forward(self, x):
        a = x.sin()
        s = a @ self.w
        return (a.cos() * self.w).exp().tanh() + s


@pytest.mark.parametrize(
    "model_fn", ["no_grad_then_formula", "sum_under_no_grad", "nan_fill", "param_mid_graph"]
)
def test_fx_region_regressions_run_like_eager(model_fn):
    from test_recompute_regions import _NanFill, _NoGradThenFormula, check_like_eager
    from torch.fx.experimental.proxy_tensor import make_fx

    model = {
        "no_grad_then_formula": _NoGradThenFormula,
        "sum_under_no_grad": _SumUnderNoGrad,
        "nan_fill": _NanFill,
        "param_mid_graph": _ParamReadMidGraph,
    }[model_fn]()
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    gm = make_fx(model)(x) if model_fn == "param_mid_graph" else _pre_dispatch(model, x)
    memslim.fx.optimize(gm)
    check_like_eager(model, gm, x)


class _RegionIsTheOutput(nn.Module):
    """Review finding (2026-11-24): a region whose output is the program's output (or a
    buffer's new value) left the ExportedProgram's signature naming a node that was gone:
    torch.export.save and _validate failed."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(64, 64)
        self.register_buffer("ema", torch.zeros(64, 64))

    def forward(self, x):
        h = self.l(x)
        y = (h.sin() * h.cos()).exp()
        self.ema.copy_(y.tanh() * 0.5)
        return (y.sigmoid() * h).tanh()


def test_exported_region_outputs_keep_the_signature_valid(tmp_path):
    torch.manual_seed(0)
    model = _RegionIsTheOutput()
    x = torch.randn(64, 64)
    ep = memslim.fx.optimize(torch.export.export(model, (x,)))
    assert any(
        d.pass_ == "recompute-pointwise-regions" and d.verdict == "rewrote"
        for d in memslim.report(ep)
    )
    ep._validate()
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    loaded = torch.export.load(str(tmp_path / "m.pt2")).module()
    ref = _RegionIsTheOutput()
    ref.load_state_dict(model.state_dict())
    torch.testing.assert_close(loaded(x), ref(x))
    torch.testing.assert_close(loaded.ema, ref.ema)


class _InplaceUnderNoGrad(nn.Module):
    """Fuzz seed 927093 (compile-budget leg), reduced: an in-place activation under
    no_grad on a tensor that requires grad. The write is invisible to autograd, so the
    gradient of `z + ...` flows into y's history; tanh(y) under no_grad would make a
    tensor with none (memslim.compile's gradients were 0.98 off)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        y = h * 2
        with torch.no_grad():
            z = y.tanh_()
        return z + h.sum()


def test_inplace_activation_under_no_grad_is_not_functionalized():
    from memslim._policy import check

    x = torch.randn(4, 8)
    gm = _pre_dispatch(_InplaceUnderNoGrad(), x)
    decisions, _, _, _ = memslim.fx._plan(
        gm, ["functionalize-inplace-activations"], check("test", {})
    )
    tanh = [d for d in decisions if "tanh_" in d.site]
    assert len(tanh) == 1 and tanh[0].verdict == "kept", [str(d) for d in decisions]
    assert "grad mode" in tanh[0].text, tanh[0].text
