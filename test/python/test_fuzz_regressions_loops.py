"""Fuzz findings, minimized (see test_fuzz_regressions.py for how they run): values yielded
by ifs and written after, dead loops (regions, rng order), CSE twins without a device,
formula gradients at 0, leaf views written in place, the fp64 rule's draws.
Split from test_fuzz_regressions.py by topic; each file under the size rules."""

from __future__ import annotations

import pytest
from fuzz_regression import HEADER, check, worker


@pytest.fixture(scope="module")
def session():
    yield from worker()


# Seventh long run (seeds 220000-, commit f298fa1), shrunk.
# 226034: relu_ functionalized inside `if self.flag0:`; relu -> softplus then formed a
# DifferentiableGraph in the branch that keeps softplus's output (TorchScript's symbolic
# gradient keeps it), which the branch yields and selu_ writes after the If. The gate's
# executor chain ended at the block, and the If's output was another tensor to it.
IF_YIELDED_THEN_WRITTEN = """
class P(torch.nn.Module):
    def __init__(self, flag0: bool):
        super().__init__()
        self.flag0 = flag0
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.2500)
        self.act0 = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        v0 = torch.matmul(x, self.w0.t())
        if self.flag0:
            v1 = self.act0(v0)
            v2 = F.softplus(v1)
            v3 = v2
        else:
            v3 = x
        v4 = F.selu(v3, inplace=True)
        return v3.mean(),


def make():
    torch.manual_seed(226034)
    m = P(True).to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 16, dtype=torch.float32),)
"""


def test_if_yielded_value_written_after(session):
    check(session, IF_YIELDED_THEN_WRITTEN)


# Eighth long run (seeds 240000-259999, commit b9b0ca5), shrunk.
# 246750: a hand-written hardswish feeding only a dead loop was rewritten as a region;
# TorchScript's executor formed its DifferentiableGraphs before deleting the dead code,
# grouping linear -> abs -> div into one graph that kept the linear's output, which
# sigmoid_ then wrote: backward failed. The unmodified graph lost that code first. Fixed:
# cleanup removes dead If/Loop nodes whose blocks are pure.
DEAD_LOOP_KEPT_A_REGION = """
class P(torch.nn.Module):
    def __init__(self, flag0: bool):
        super().__init__()
        self.flag0 = flag0
        self.w0 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)

    def forward(self, x):
        v0 = F.linear(x, self.w0)
        if self.flag0:
            v1 = v0
        else:
            v1 = v0
        v2 = v0 / (v0.abs() + 1.0)
        v3 = F.elu(v2, inplace=True)
        v4 = torch.sigmoid_(v0)
        v5 = v3 * torch.clamp(v3 + 3.0, 0.0, 6.0) / 6.0
        v6 = v4 * 1.0
        for i in range(3):
            v7 = torch.addcdiv(v5, v6, v0.abs() + 1.0, value=0.3)
            v6 = v7
        return v4,


def make():
    torch.manual_seed(246750)
    m = P(False).to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 8, dtype=torch.float32),)
"""


def test_dead_loop_keeps_no_region(session):
    check(session, DEAD_LOOP_KEPT_A_REGION)


# Ninth long run (seeds 260000-267524, commit a5155fd, stopped at these two), shrunk.
# 263425: an eval-mode dropout returns v0 and the program returns it; `v0[0].add_(1)` is
# seen by TorchScript's DCE only through v0's other readers, a clone and a loop that are
# dead. cleanup (since a5155fd) deleted them, the executor's DCE then judged the write
# unobservable and deleted it: outputs 0.58 off. Fixed: cleanup keeps dead nodes that read a
# tensor a dropout may return.
DEAD_READER_OF_HIDDEN_WRITE = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        v0 = F.hardswish(x)
        v1 = F.dropout(v0, 0.1, self.training)
        v0[0].add_(1.0)
        v2 = v0.clone()
        for i in range(1):
            v2 = v0 + v2 * 0.5
        return v1


def make():
    torch.manual_seed(263425)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 24, dtype=torch.float32),)
"""
# 266858: tanh_ -> relu6 -> add_. Functionalized, tanh and relu6 joined one
# DifferentiableGraph that keeps relu6's output (its symbolic gradient reads the result),
# which add_ then wrote. The gate's chain asked torch's isDifferentiable, which says no
# for relu6; the executor differentiates it anyway.
RELU6_IN_THE_EXECUTOR_CHAIN = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)

    def forward(self, x):
        v0 = torch.matmul(x, self.w0.t())
        v1 = v0.tanh_()
        v2 = F.relu6(v1)
        v2.add_(1.0)
        return x + v2.mean(),


def make():
    torch.manual_seed(266858)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 8, dtype=torch.float32),)
"""


def test_dead_reader_of_hidden_write_stays(session):
    check(session, DEAD_READER_OF_HIDDEN_WRITE)


def test_relu6_joins_the_executor_chain(session):
    check(session, RELU6_IN_THE_EXECUTOR_CHAIN)


# Tenth long run (seeds 280000-288782, commit 316dea7, stopped), as generated (not shrunk).
# 282726 (and 280077, 285059, same cause): the dead-loop removal of a5155fd moved the
# optimizing executor's dropout draws on the first call ("wrong" at call 1, not rng-order).
# Fixed by reverting it: cleanup leaves If/Loop nodes alone; the gate refuses rewrites of
# dead code instead (SafetyGate::live), which also keeps 246750 fixed.
DEAD_LOOP_RNG_ORDER = """
class P(torch.nn.Module):
    def __init__(self, flag0: bool):
        super().__init__()
        self.flag0 = flag0
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.2500)
        self.drop0 = torch.nn.Dropout(0.5)

    def forward(self, x, b: bool):
        v1 = F.linear(x, self.w0)
        v1.add_(x)
        v2 = self.drop0(v1)
        v3 = torch.zeros_like(v2)
        for i in range(1):
            v4 = v2 * (i + 1)
            v5 = F.selu(v3)
            v3 = v3 + v5
        v6 = F.leaky_relu(x, 0.2)
        v7 = F.dropout(v6, p=0.1, training=self.training, inplace=True)
        v7.sub_(0.25)
        v7.add_(v6)
        if self.flag0:
            v8 = v7 * v7
            v10 = v8
        else:
            v1.addcmul_(v7, v7, value=0.1)
            v2.add_(x, alpha=0.5)
            v9 = -v7
            v10 = v9
        v11 = torch.tanh(v7)
        return v11 + v10.mean()


def make():
    torch.manual_seed(282726)
    m = P(True).to(torch.float32)
    m.train()
    return m, (torch.randn(8, 16, dtype=torch.float32), True)
"""
# 286566: the erf GELU formula canonicalized next to the user's own gelu of the same chunk
# piece (torch's CSE merges the two); the optimized module's backward then failed in the
# TorchScript interpreter with "tensor does not have a device". The cause is TorchScript's:
# `a, b = y.chunk(2, 1); return x + silu(b).mean()` fails without memslim, the executor's
# chunk backward getting an undefined gradient for the piece nobody reads (here `v2`, read
# only by dead code); the twin merge changed how the executor cut the graph. The gate now
# keeps every rewrite in a graph with such a piece. Both forms: the seed's own (its erf
# GELU is no longer canonicalized, so it would pass without the rule) and its silu twin.
GELU_TWIN_NO_DEVICE = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop0 = torch.nn.Dropout(0.1)

    def forward(self, x, y):
        v2, v3 = y.chunk(2, dim=1)
        v4 = v2 + 0.5
        v5 = torch.sigmoid(x)
        v4.mul_(2.0)
        v6 = self.fn0(v3)
        v7 = 0.5 * v3 * (1.0 + torch.erf(v3 / math.sqrt(2.0)))
        v8 = self.drop0(x)
        return v8 + v5.mean() + v6.mean() + v7.sum() * 0.0

    def fn0(self, x):
        return F.gelu(x)


def make():
    torch.manual_seed(286566)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 24, dtype=torch.float32), torch.randn(4, 24, dtype=torch.float32))
"""
SILU_TWIN_NO_DEVICE = GELU_TWIN_NO_DEVICE.replace(
    "0.5 * v3 * (1.0 + torch.erf(v3 / math.sqrt(2.0)))", "v3 * torch.sigmoid(v3)"
).replace("F.gelu(x)", "F.silu(x)")
# 282798: a FracAct-like lgamma/pow formula, `where` branches and in-place writes; the
# gradient of the 0-dim parameter s0 was 1.3e-3 off eager at call 2 (bar 1e-3), the
# unmodified scripted module 1.9e-3 off. Its erf GELU formula had become aten::gelu, less
# accurate on the CPU for x < -1 (314804's cause); now left as written.
LGAMMA_GRAD_S0 = """
class P(torch.nn.Module):
    def __init__(self, flag0: bool):
        super().__init__()
        self.flag0 = flag0
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.2500)
        self.s0 = torch.nn.Parameter(torch.tensor(0.40))

    def forward(self, x):
        v1 = F.linear(x, self.w0)
        t2_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t2_p = torch.where(v1 > 0, v1, 1.0)
        t2_p = 1.0507 * torch.pow(t2_p, 1 - t2_a) / torch.exp(torch.lgamma(2 - t2_a))
        t2_q = torch.where(v1 <= 0, v1, 1.0)
        t2_g = torch.exp(torch.lgamma(1 + t2_a))
        t2_acc = (1 - torch.exp(t2_q)) * t2_g / torch.exp(torch.lgamma(1 + t2_a))
        t2_acc = t2_acc - (1 - torch.exp(t2_q - 1.0)) * t2_g / torch.exp(torch.lgamma(t2_a))
        v2 = torch.where(v1 > 0, t2_p, 1.7581 / torch.pow(1.0, t2_a) * t2_acc)
        F.relu(v2[:, :7], inplace=True)
        v3 = torch.tanh(F.softplus(v2)) * v2
        if self.flag0:
            v4 = 1.0 - v3
            v6 = v4
        else:
            v5 = torch.addcmul(v2, v3, x, value=0.5)
            v6 = v5
        v7 = F.softplus(v2, beta=2.0, threshold=5.0)
        torch.sigmoid_(v6)
        v8, v9 = v6.chunk(2, dim=1)
        v10 = 0.5 * v9 * (1.0 + torch.tanh(0.7978845608028654 * (v9 + 0.044715 * v9 * v9 * v9)))
        v7.relu_()
        v11 = torch.addcmul(v3, v3, v7, value=0.5)
        v12 = torch.sigmoid(v10)
        v13 = v10 * v12
        if self.training:
            v14 = torch.sin(v13)
            v17 = v14
        else:
            v15 = v13 * F.relu6(v13 + 3.0) / 6.0
            v16 = 0.5 * v12 * (1.0 + torch.erf(v12 / math.sqrt(2.0)))
            v17 = v16
        return v17 + v8.mean() + v11.mean()


def make():
    torch.manual_seed(282798)
    m = P(True).to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 16, dtype=torch.float32),)
"""


def test_dead_loop_keeps_rng_order(session):
    check(session, DEAD_LOOP_RNG_ORDER)


@pytest.mark.parametrize("prog", [GELU_TWIN_NO_DEVICE, SILU_TWIN_NO_DEVICE], ids=["gelu", "silu"])
def test_twin_backward_has_a_device(session, prog):
    assert (
        SILU_TWIN_NO_DEVICE.count("torch.sigmoid(v3)") == 1 and "F.silu(x)" in SILU_TWIN_NO_DEVICE
    )
    check(session, prog)


def test_lgamma_formula_grad_s0(session):
    check(session, LGAMMA_GRAD_S0)


# Eleventh long run (seeds 300000-319999, commit 530ff59), as generated (not shrunk).
# 314804 (shrunk): memslim-opt --verify: a gradient 1.7e-4 off the fp64 reference (bar 1e-4;
# the input graph's own 3.5e-6). The erf GELU formula had become aten::gelu, whose CPU
# kernel is less accurate for x < -1, and the FracAct's pow after it amplified that.
# canonicalize-activations now leaves the erf formula as written.
VERIFY_GRAD_2E4 = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(8) * 0.1)
        self.s0 = torch.nn.Parameter(torch.tensor(1.11))

    def forward(self, x):
        v0 = F.linear(x, self.w0, self.b0)
        v1 = 1.0 + torch.erf(v0 * 0.7071067811865476)
        v2 = 0.5 * v0 * v1
        v3 = -v2
        t12_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t12_p = torch.where(v3 > 0, v3, 1.0)
        t12_p = 1.0507 * torch.pow(t12_p, 1 - t12_a) / torch.exp(torch.lgamma(2 - t12_a))
        t12_q = torch.where(v3 <= 0, v3, 1.0)
        t12_g = torch.exp(torch.lgamma(1 + t12_a))
        t12_acc = (1 - torch.exp(t12_q)) * t12_g / torch.exp(torch.lgamma(1 + t12_a))
        t12_acc = t12_acc - (1 - torch.exp(t12_q - 1.0)) * t12_g / torch.exp(torch.lgamma(t12_a))
        v4 = torch.where(v3 > 0, t12_p, 1.7581 / torch.pow(1.0, t12_a) * t12_acc)
        return v4


def make():
    torch.manual_seed(314804)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 24, dtype=torch.float32),)
"""
# 315436 (shrunk): the region over v4's formula regrouped the executor's graphs so that
# where(...) -> t(v3) formed one DifferentiableGraph returning the view without its base;
# silu_ on the view then raised "a view of a leaf Variable that requires grad is being used
# in an in-place operation" (TorchScript's own failure: the unmodified module forms no such
# graph). The gate now refuses rewrites whose executor chain makes a view written later.
LEAF_VIEW_INPLACE = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 16) * 0.2500)
        self.w2 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.s0 = torch.nn.Parameter(torch.tensor(0.93))
        self.act0 = torch.nn.SiLU(inplace=True)

    def forward(self, x):
        v0 = torch.matmul(x, self.w0.t())
        v1 = F.linear(v0, self.w2, self.b0)
        v2 = torch.addcmul(v0, v0, v0, value=0.5)
        t5_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t5_p = torch.where(v2 > 0, v2, 1.0)
        t5_p = 1.0507 * torch.pow(t5_p, 1 - t5_a) / torch.exp(torch.lgamma(2 - t5_a))
        t5_q = torch.where(v2 <= 0, v2, 1.0)
        t5_g = torch.exp(torch.lgamma(1 + t5_a))
        t5_acc = (1 - torch.exp(t5_q)) * t5_g / torch.exp(torch.lgamma(1 + t5_a))
        t5_acc = t5_acc - (1 - torch.exp(t5_q - 1.0)) * t5_g / torch.exp(torch.lgamma(t5_a))
        v3 = torch.where(v2 > 0, t5_p, 1.7581 / torch.pow(1.0, t5_a) * t5_acc)
        t6_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t6_p = torch.where(v0 > 0, v0, 1.0)
        t6_p = 1.0507 * torch.pow(t6_p, 1 - t6_a) / torch.exp(torch.lgamma(2 - t6_a))
        t6_q = torch.where(v0 <= 0, v0, 1.0)
        t6_g = torch.exp(torch.lgamma(1 + t6_a))
        t6_acc = (1 - torch.exp(t6_q)) * t6_g / torch.exp(torch.lgamma(1 + t6_a))
        t6_acc = t6_acc - (1 - torch.exp(t6_q - 1.0)) * t6_g / torch.exp(torch.lgamma(t6_a))
        v4 = torch.where(v0 > 0, t6_p, 1.7581 / torch.pow(1.0, t6_a) * t6_acc)
        v5 = v3.t()
        v6 = self.act0(v5)
        return x + v1.sum() * 0.1 + v6.sum() * 0.1 + v4.mean(),


def make():
    torch.manual_seed(315436)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 16, dtype=torch.float32),)
"""


def test_verify_gradient_within_bar(session):
    check(session, VERIFY_GRAD_2E4)


def test_leaf_view_not_written(session):
    check(session, LEAF_VIEW_INPLACE)


# 335273 (long-fuzz run 12 at af82d20): a FracAct-like lgamma/pow formula after a
# hand-written silu (canonicalized); the 0-dim parameter s0's gradient is 1.69e-4 off eager
# at call 1 (bar 1e-4), the unmodified scripted module 1.67e-4 off. Against fp64 eager:
# eager's own error 3.8e-4, memslim's 5.5e-4; the fp64 twins agree within 6e-13 (rounding of
# a cancelling sum: without canonicalize-activations the error equals eager's). The judge
# did not apply its fp64 rule because the program draws random numbers (a dropout that does
# not touch s0); memslim-opt --verify always did. Now it does, for tensors whose fp64 draws
# agree with fp32 eager's.
FRACACT_SILU_GRAD_S0 = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 8) * 0.3536)
        self.w1 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.w2 = torch.nn.Parameter(torch.randn(24, 24) * 0.2041)
        self.s0 = torch.nn.Parameter(torch.tensor(1.04))
        self.register_buffer("consts0", torch.tensor([0.0, 1.0, 2.0]), persistent=False)

    def forward(self, x):
        v1 = torch.matmul(x, self.w0.t())
        v2 = x + 0.5
        v3 = torch.cat([v2, v2], dim=1)
        v4 = F.softplus(v3)
        v5 = F.dropout(v4, 0.1, self.training)
        if self.training:
            v6 = v1 + 0.5
            v9 = v6
        else:
            v1.tanh_()
            v7 = torch.addcdiv(v3, v5, v3.abs() + 1.0, value=0.3)
            v8 = v1 + 0.5
            v9 = v8
        v10 = F.linear(v9, self.w1)
        v11 = F.dropout(v5, p=0.5, training=True)
        v11.div_(2.0)
        v12 = torch.sigmoid(v9)
        v13 = v9 * v12
        v14 = v13 @ self.w2.t()
        v15 = F.mish(v14)
        t16_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t16_p = torch.where(v15 > 0, v15, 1.0)
        t16_p = 1.0507 * torch.pow(t16_p, 1 - t16_a) / torch.exp(torch.lgamma(2 - t16_a))
        t16_q = torch.where(v15 <= 0, v15, 1.0)
        t16_g = torch.exp(torch.lgamma(1 + t16_a))
        t16_n = self.consts0[1]
        t16_acc = (1 - torch.exp(t16_q)) * t16_g / torch.exp(torch.lgamma(1 + t16_a))
        t16_acc = t16_acc + (1 - torch.exp(t16_q - t16_n)) * t16_g / torch.exp(torch.lgamma(t16_a)) * torch.pow(-1, t16_n)
        v16 = torch.where(v15 > 0, t16_p, 1.7581 / torch.pow(1.0, t16_a) * t16_acc)
        v17 = v16 * 2.0 - 1.0
        return v11, v12 + v4.mean(), v17 + v10.sum() * 0.1


def make():
    torch.manual_seed(335273)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 8, dtype=torch.float32),)

"""


def test_fracact_silu_grad_s0_is_fp32_rounding(session):
    res = session.run({"id": "regression", "source": HEADER + FRACACT_SILU_GRAD_S0})
    assert res["class"] == "fp32-rounding", (res["class"], res.get("detail"))


def test_random_program_fp64_rule_needs_the_same_draws():
    """The fp64 rule on a random program: a tensor that differs from eager's by a dropout
    mask drawn elsewhere is not rounding. The 'rewritten' result carries a small dropout
    term with another mask (rel between 1e-4 and 1e-3 against eager); fp64 eager drew
    fp32 eager's mask, so the rewritten fp32 error is far over 4 x eager's own."""
    import torch
    import torch.nn.functional as F
    from runner import BARS, Reference, call, fp64_twin_same, trainable

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return x @ self.w + 3e-4 * F.dropout(x, 0.5, True)

    class Prog:
        @staticmethod
        def make():
            torch.manual_seed(0)
            return M(), (torch.randn(4, 8),)

    m, ins = Prog.make()
    eager = call(m, ins, trainable(m))
    torch.manual_seed(4321)  # another mask for the "rewritten" result
    got = dict(eager, **{"out:0": m(ins[0]).detach()})
    rel = ((got["out:0"] - eager["out:0"]).norm() / eager["out:0"].norm()).item()
    assert BARS["float32"] < rel < 1e-3, rel
    assert not fp64_twin_same(Prog, ins, got, Reference("float32", eager, {}, [], True))


# Seed 363139 (long fuzz over 360000:364000, this session; also fails at 369e1ad, so
# older than the FX work): memslim.optimize's module raises "one of the variables needed
# for gradient computation has been modified by an inplace operation ... output 1 of
# DifferentiableGraph" where eager and the scripted module train. Minimized by
# `fuzz.py shrink`: softplus(x) then tanh_() on its output, an If on a module flag, the
# hand-written mish of the If's result. The program as written is fragile under
# TorchScript (softplus's symbolic gradient reads the output tanh_ writes; it trains only
# while CSE and the executor's inlining threshold keep softplus out of a
# DifferentiableGraph): the gate now keeps every rewrite in such a graph, and its
# executor chains reach the blocks around a rewrite.
SOFTPLUS_TANH_INPLACE = """
class P(torch.nn.Module):
    def __init__(self, flag0: bool):
        super().__init__()
        self.flag0 = flag0

    def forward(self, x):
        v0 = x.unsqueeze(0)
        v1 = v0.squeeze(0)
        v2 = x.unsqueeze(0)
        v3 = v2.squeeze(0)
        v4 = v3 * 1.0
        v5 = F.softplus(v3)
        v5.tanh_()
        if self.flag0:
            v6 = v5
        else:
            v7 = torch.addcdiv(v4, v1, v4.abs() + 1.0, value=0.3)
            v6 = v7
        v8 = v6 * torch.tanh(F.softplus(v6))
        v9 = torch.cos(v8)
        return v9,


def make():
    # (module, example inputs) for this program; deterministic
    torch.manual_seed(363139)
    m = P(False).to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 24, dtype=torch.float32),)
"""


def test_softplus_then_inplace_tanh_under_if(session):
    check(session, SOFTPLUS_TANH_INPLACE)
