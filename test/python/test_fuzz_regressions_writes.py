"""Fuzz findings, minimized (see test_fuzz_regressions.py for how they run): in-place writes
next to rewrites and TorchScript's executor chains, chunk and cat around them, recompute
regions' gradients, and --verify's reference per tensor.
Split from test_fuzz_regressions.py by topic; each file under the size rules."""

from __future__ import annotations

import pytest
from fuzz_regression import HEADER, check, runner, worker


@pytest.fixture(scope="module")
def session():
    yield from worker()


# Long-mode seed 104593 (shrunk): hardswish -> sigmoid -> hardswish -> dropout_(inplace).
# Rewriting the first hardswish left sigmoid + the second hardswish as a DifferentiableGraph
# of TorchScript's executor that keeps the second hardswish's output, which dropout_ then
# writes: backward failed from the second call ("modified by an inplace operation"); the
# unmodified scripted module trains. The gate now keeps rewrites off executor chains whose
# tensors are written in place.
EXECUTOR_CHAIN_WRITTEN = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 16) * 0.2500)
        self.lin0 = torch.nn.Linear(8, 16, bias=True)

    def forward(self, x):
        v0 = torch.matmul(x, self.w0.t())
        if self.training:
            v1 = x
        else:
            v1 = x
        v2 = F.hardswish(v0)
        v3 = v2.unsqueeze(0)
        v4 = v3.squeeze(0)
        v5 = self.lin0(v3)
        v6 = torch.sigmoid(v2)
        v7 = F.hardswish(v6)
        v8 = F.dropout(v7, p=0.1, training=True, inplace=True)
        return v8 + v4.sum() * 0.0 + v5.sum() * 0.0 + v2.mean()


def make():
    torch.manual_seed(104593)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 16, dtype=torch.float32),)
"""


def test_rewrite_next_to_an_executor_chain_written_in_place(session):
    check(session, EXECUTOR_CHAIN_WRITTEN)


# Long-mode seed 108683 (shrunk): F.relu(v0[:, :8], inplace=True) after an eval-mode
# dropout that returns v0 itself. Inside F.relu's `if inplace` the write's only reader
# was the If; constant propagation folded it and its DCE (trusting AliasDb, which cannot
# see dropout's alias) deleted the write: memslim-opt --verify saw the output change.
# optimize now pins every in-place write through that step, read or not.
WRITE_INSIDE_FOLDED_IF = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        v0 = F.selu(x)
        v1 = F.dropout(v0, 0.1, self.training)
        F.relu(v0[:, :8], inplace=True)
        return v1,


def make():
    torch.manual_seed(108683)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 16, dtype=torch.float32),)
"""


def test_write_inside_folded_if_kept(session):
    check(session, WRITE_INSIDE_FOLDED_IF)


# Long-mode seed 105723 (shrunk): v0 = x * x; cat([v0, x]); celu_(v0) later. Under
# TorchScript's executor cat keeps its inputs when it lands in a DifferentiableGraph; the
# region rewrite of hardsigmoid + addcmul after the celu_ changed the executor's chains so
# that one kept v0, which celu_ writes: backward failed from the second call.
CAT_INPUT_WRITTEN = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.g0 = torch.nn.Parameter(1.0 + torch.randn(32) * 0.1)
        self.w1 = torch.nn.Parameter(torch.randn(24, 16) * 0.2500)
        self.b0 = torch.nn.Parameter(torch.randn(24) * 0.1)

    def forward(self, x):
        v0 = x * x
        v1 = torch.cat([v0, x], dim=1)
        v2 = torch.addcmul(self.g0, self.g0, v1)
        v3 = F.celu(v0, alpha=0.5, inplace=True)
        v4 = F.hardsigmoid(v3)
        v5 = torch.addcmul(v4, x, x, value=0.5)
        v6 = F.linear(v5, self.w1, self.b0)
        return v6 + v2.mean(),


def make():
    torch.manual_seed(105723)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 16, dtype=torch.float32),)
"""


def test_rewrite_reshaping_a_chain_whose_input_is_written(session):
    check(session, CAT_INPUT_WRITTEN)


# Long-mode seed 107971 (shrunk): a recompute region whose output `zeros_like(x) ** 2`
# requires grad after the rewrite (every region output does) and not before. memslim-opt
# --verify drew a loss weight only for outputs requiring grad, so every later output's
# weight shifted and the gradients "differed" by 0.83. Weights are now drawn per output.
REGION_OUTPUT_REQUIRES_GRAD = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.s0 = torch.nn.Parameter(torch.tensor(0.22))
        self.register_buffer("consts0", torch.tensor([0.0, 1.0, 2.0]), persistent=False)

    def forward(self, x):
        v0 = torch.zeros_like(x)
        for i in range(2):
            pass
        v1 = v0 * v0
        t8_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t8_p = torch.where(v1 > 0, v1, 1.0)
        t8_p = 1.0507 * torch.pow(t8_p, 1 - t8_a) / torch.exp(torch.lgamma(2 - t8_a))
        t8_q = torch.where(v1 <= 0, v1, 1.0)
        t8_g = torch.exp(torch.lgamma(1 + t8_a))
        t8_n = self.consts0[1]
        t8_acc = (1 - torch.exp(t8_q)) * t8_g / torch.exp(torch.lgamma(1 + t8_a))
        t8_acc = t8_acc + (1 - torch.exp(t8_q - t8_n)) * t8_g / torch.exp(torch.lgamma(t8_a)) * torch.pow(-1, t8_n)
        v2 = torch.where(v1 > 0, t8_p, 1.7581 / torch.pow(1.0, t8_a) * t8_acc)
        return v1, v2


def make():
    torch.manual_seed(107971)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 8, dtype=torch.float32),)
"""


def test_verify_weights_do_not_depend_on_requires_grad(session):
    check(session, REGION_OUTPUT_REQUIRES_GRAD)


# Long-mode seed 107469 (shrunk): softplus -> dropout -> copy_ -> clamp_ on softplus's
# output, then a hand-written hardswish on a slice of the dropout. Canonicalized and
# rewritten, the hardswish changed the executor's chain around softplus, whose
# DifferentiableGraph then kept v0, which clamp_ writes: backward failed.
SOFTPLUS_CHAIN_WRITTEN = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        v0 = F.softplus(x, beta=2.0, threshold=5.0)
        v1 = F.dropout(v0, 0.1, True)
        v1.copy_(v0)
        v0.clamp_(-3.0, 3.0)
        v2 = v1[:, 10:]
        v3 = v2 * torch.clamp(v2 + 3.0, 0.0, 6.0) / 6.0
        return v3


def make():
    torch.manual_seed(107469)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 16, dtype=torch.float32),)
"""


def test_rewrite_reshaping_a_chain_written_later(session):
    check(session, SOFTPLUS_CHAIN_WRITTEN)


# Long-mode seed 116512 (shrunk): linear -> hardswish_(inplace) -> chunk, one piece
# unused. Functionalized, hardswish and chunk formed a DifferentiableGraph, and
# TorchScript's executor gets that graph's backward wrong from the second call (the
# unused piece's gradient at the whole tensor's size; `chunk(sigmoid(h), 2)[0]` fails
# scripted without memslim). functionalize keeps the in-place form there.
FUNCTIONAL_INTO_CHUNK = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 8) * 0.3536)
        self.b0 = torch.nn.Parameter(torch.randn(24) * 0.1)

    def forward(self, x):
        v0 = F.linear(x, self.w0, self.b0)
        v1 = F.hardswish(v0, inplace=True)
        v2, v3 = v1.chunk(2, dim=1)
        return v2


def make():
    torch.manual_seed(116512)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 8, dtype=torch.float32),)
"""


def test_functionalize_keeps_chunk_out_of_the_executor_chain(session):
    check(session, FUNCTIONAL_INTO_CHUNK)


# Long-mode seed 123965 (shrunk, second 20,000-program run): v0 = linear; cat([v0, v0]);
# sigmoid_ on the cat; mish_(v0). Functionalized, sigmoid joined cat in a DifferentiableGraph,
# whose symbolic gradient of cat keeps v0, which mish_ then writes. The gate's executor
# chain did not link through the cat output because the covered sigmoid_ wrote it.
CAT_FUNCTIONALIZED_INPUT_WRITTEN = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(16) * 0.1)

    def forward(self, x):
        v0 = F.linear(x, self.w0, self.b0)
        v1 = torch.cat([v0, v0], dim=1)
        v2 = torch.sigmoid_(v1)
        v3 = F.mish(v0, inplace=True)
        return v3 + v2.sum() * 0.0


def make():
    torch.manual_seed(123965)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 24, dtype=torch.float32),)
"""


def test_functionalize_next_to_cat_whose_input_is_written(session):
    check(session, CAT_FUNCTIONALIZED_INPUT_WRITTEN)


# Long-mode seed 124836 (shrunk, second run): chunk -> t() -> hardsigmoid -> dropout, fused.
# The activation made its non-dense input contiguous where aten keeps the stride order, and
# the dropout mask drawn over that layout put each keep bit on another element: a seeded
# run no longer gave aten's values (0.44 off). The ops now lay out as aten does.
NONDENSE_ACTIVATION_DROPOUT = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        v0, v1 = x.chunk(2, dim=1)
        v2 = v1.t()
        v3 = F.hardsigmoid(v2)
        v4 = F.dropout(v3, 0.2, self.training)
        return v4 + v0.mean(),


def make():
    torch.manual_seed(124836)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(8, 16, dtype=torch.float32),)
"""


def test_fused_dropout_on_a_transposed_slice_draws_atens_mask(session):
    check(session, NONDENSE_ACTIVATION_DROPOUT)


# Long-mode seed 143617 (shrunk, third run): v0 = linear; v1 = softplus(v0); mish_(v1);
# v0.chunk(2) -> softplus -> linear. Rewriting the second softplus reshaped the executor's
# chain through chunk (a prim::ConstantChunk in its graphs), and a DifferentiableGraph then
# kept v1, which mish_ writes. The gate's chain now links through chunk.
CHUNK_LINKS_THE_CHAIN = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.lin0 = torch.nn.Linear(8, 8, bias=False)

    def forward(self, x):
        v0 = F.linear(x, self.w0, self.b0)
        v1 = F.softplus(v0, beta=2.0, threshold=5.0)
        F.mish(v1, inplace=True)
        v2, v3 = v0.chunk(2, dim=1)
        v4 = F.softplus(v3)
        v5 = self.lin0(v4)
        return v1 + v0, v2, v5


def make():
    torch.manual_seed(143617)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 24, dtype=torch.float32),)
"""


def test_rewrite_after_chunk_reshaping_a_chain_written_later(session):
    check(session, CHUNK_LINKS_THE_CHAIN)


# Findings of the third long run (seeds 140000-145872, commit e77f762), shrunk (fixed since;
# the test is at the end of this file).
# 144972: rsqrt's output written by addcmul_, regions over where() in loops downstream; the
# optimized module's backward reads the written tensor (eager's backward never reaches it).
RSQRT_WRITTEN_REGION_LOOP = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(24, 16, bias=True)

    def forward(self, x):
        v0 = torch.rsqrt(x * x + 1.0)
        v0.addcmul_(v0, v0, value=0.1)
        v1 = torch.tanh(x)
        v2 = self.lin0(v1)
        v3 = torch.where(v0 > v1, v0, v1 * 0.5)
        v4 = v3[:, 11:]
        v5 = v4
        for i in range(3):
            v6 = torch.where(v5 > v5, v5, v5 * 0.5)
            v5 = v6
        return v2


def make():
    torch.manual_seed(144972)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 24, dtype=torch.float32),)
"""
# 144211: a gradient 1.58e-4 off eager and the scripted module (bar 1e-4): the hand-written
# fractional activation region over a gelu-formula output.
FRAC_REGION_GRADIENT = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(24) * 0.1)
        self.lin0 = torch.nn.Linear(24, 24, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.w2 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)
        self.w3 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.s0 = torch.nn.Parameter(torch.tensor(1.18))
        self.register_buffer("consts0", torch.tensor([0.0, 1.0, 2.0]), persistent=False)

    def forward(self, x):
        v0 = F.linear(x, self.w0, self.b0)
        v1 = v0 * v0
        v2 = v1.transpose(0, 1)
        v3 = self.lin0(v1)
        v4 = self.fn0(v2)
        v5 = torch.matmul(v4, self.w1.t())
        v6 = F.linear(v4, self.w2)
        v7 = v5 @ self.w3.t()
        t16_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t16_p = torch.where(v6 > 0, v6, 1.0)
        t16_p = 1.0507 * torch.pow(t16_p, 1 - t16_a) / torch.exp(torch.lgamma(2 - t16_a))
        t16_q = torch.where(v6 <= 0, v6, 1.0)
        t16_g = torch.exp(torch.lgamma(1 + t16_a))
        t16_n = self.consts0[1]
        t16_acc = (1 - torch.exp(t16_q)) * t16_g / torch.exp(torch.lgamma(1 + t16_a))
        t16_acc = t16_acc + (1 - torch.exp(t16_q - t16_n)) * t16_g / torch.exp(torch.lgamma(t16_a)) * torch.pow(-1, t16_n)
        v8 = torch.where(v6 > 0, t16_p, 1.7581 / torch.pow(1.0, t16_a) * t16_acc)
        return v8

    def fn0(self, x):
        return x * 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))


def make():
    torch.manual_seed(144211)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 24, dtype=torch.float32),)
"""
# 144414: memslim-opt --verify: the rewritten graph failed in the interpreter ("Expected
# Tensor but got None") where the input graph runs (a loop's output into a region).
VERIFY_REWRITTEN_FAILS = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act0 = torch.nn.Hardswish()

    def forward(self, x):
        v0 = self.fn0(x)
        v1 = torch.zeros_like(x)
        for i in range(3):
            v1 = v1 + x
        v2 = v1 * torch.sigmoid(v0)
        if self.training:
            v3 = v2 - v2
            v4 = v3
        else:
            v4 = v2
        v5 = v4[:, :13]
        v6 = v5
        for i in range(3):
            v7 = self.act0(v6)
        return v4,

    def fn0(self, x):
        return x / (1.0 + torch.exp(-x))


def make():
    torch.manual_seed(144414)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 24, dtype=torch.float32),)
"""


# Fourth long run (seeds 160000-167945, commit a6c58f4), 161800 shrunk: x * sigmoid(x)
# canonicalized to silu(x) beside the user's own silu(x), whose output an eval-mode
# dropout returns and mul_ then writes. torch's CSE cannot see that alias (dropout's
# schema declares none) and merged the two silu nodes: v2 got the write too (output 1/3
# off eager on the first call).
CANONICAL_TWIN_OF_A_HIDDEN_WRITE = """class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop0 = torch.nn.Dropout(0.5)

    def forward(self, x):
        v2 = x * torch.sigmoid(x)
        v3 = F.silu(x)
        v4 = self.drop0(v3)
        v4.mul_(0.5)
        return v2 + v4


def make():
    torch.manual_seed(161800)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 24, dtype=torch.float32),)
"""


def test_canonical_op_is_no_cse_twin_of_a_hidden_write(session):
    check(session, CANONICAL_TWIN_OF_A_HIDDEN_WRITE)


# 161240 shrunk: softplus -> dropout fused, its result unread; cleanup deleted the fused op
# (torch knows only aten's random ops), so the next dropout drew another mask than the
# input graph's (memslim-opt --verify: outputs 0.88 off). cleanup keeps it now
# (SavedTensorAnalysis::draws_random), as it keeps an unread aten::dropout.
UNREAD_FUSED_DROPOUT = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 24) * 0.2041)

    def forward(self, x):
        v1 = x @ self.w0.t()
        v3 = F.dropout(F.softplus(v1, beta=2.0, threshold=5.0), 0.2, True)
        v4 = torch.addcmul(v3, v1, v1, value=0.5)
        v5 = F.dropout(x, 0.2, True)
        return v5, torch.tanh(v1)


def make():
    torch.manual_seed(161240)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 24, dtype=torch.float32),)
"""


def test_unread_fused_dropout_still_draws(session):
    check(session, UNREAD_FUSED_DROPOUT)


# 164746 shrunk: relu_ writes v0 before unsqueeze -> softplus; the gate's executor chain
# stopped at every tensor written anywhere, so it missed that the executor merges
# unsqueeze, squeeze and softplus into one DifferentiableGraph keeping softplus's output
# once the region took the final add, and dropout_ (eval: returns its input) then add_
# wrote it: backward failed. Only a write between producer and consumer cuts a link now.
WRITE_BEFORE_THE_CHAIN = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.act0 = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        v0 = F.linear(x, self.w0)
        v1 = self.act0(v0)
        v2 = v1.unsqueeze(0)
        v3 = v2.squeeze(0)
        v4 = F.softplus(v2)
        v5 = F.dropout(v4, p=0.1, training=self.training, inplace=True)
        v5.add_(1.0)
        v6 = torch.sigmoid(v5)
        return v6 + v3.mean(),


def make():
    torch.manual_seed(164746)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(8, 8, dtype=torch.float32),)
"""


def test_write_before_the_producer_does_not_cut_the_chain(session):
    check(session, WRITE_BEFORE_THE_CHAIN)


# Fifth long run (seeds 180000-, commit 6e560c7), 181052: memslim-opt --verify failed a
# gradient 1.7e-4 off (bar 1e-4) because another tensor's float64 reference was off (its
# where() branches differ in float64), although the tensor over the bar had a good one.
VERIFY_REFERENCE_PER_TENSOR = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.s0 = torch.nn.Parameter(torch.tensor(0.29))

    def forward(self, x):
        v1 = x * 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))
        v2 = v1.view(16, 4)
        t3_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t3_p = torch.where(v1 > 0, v1, 1.0)
        t3_p = 1.0507 * torch.pow(t3_p, 1 - t3_a) / torch.exp(torch.lgamma(2 - t3_a))
        t3_q = torch.where(v1 <= 0, v1, 1.0)
        t3_g = torch.exp(torch.lgamma(1 + t3_a))
        t3_acc = (1 - torch.exp(t3_q)) * t3_g / torch.exp(torch.lgamma(1 + t3_a))
        t3_acc = t3_acc - (1 - torch.exp(t3_q - 1.0)) * t3_g / torch.exp(torch.lgamma(t3_a))
        v3 = torch.where(v1 > 0, t3_p, 1.7581 / torch.pow(1.0, t3_a) * t3_acc)
        v4 = v3 * 2.0 - 1.0
        v5 = v4 * v4
        v6 = F.softplus(v4)
        torch.sigmoid_(v5)
        v7 = 1.0 + torch.erf(v4 * 0.7071067811865476)
        v8 = 0.5 * v4 * v7
        v9 = F.mish(v7)
        v10 = v3 / (1.0 + torch.exp(-v3))
        v11, v12 = v7.chunk(2, dim=1)
        return v11 + v2.mean() + v8.mean() + v9.mean() + v10.mean(), v12 + v6.mean()


def make():
    torch.manual_seed(181052)
    m = P().to(torch.float32)
    m.train()
    return m, (torch.randn(4, 16, dtype=torch.float32),)
"""


def test_verify_judges_each_tensor_by_its_own_reference(session):
    check(session, VERIFY_REFERENCE_PER_TENSOR)


# Sixth long run (seeds 200000-214786, commit a5026d4), shrunk.
# 205868: an eval-mode dropout returned elu's output and hardsigmoid_ wrote it; the
# executor (whose AliasDb cannot see that alias) moved a read of the elu output across the
# write on the optimized module's second call, after the region rewrite regrouped its
# graphs. (Making the alias visible as `if train: dropout(x) else: x` made TorchScript's
# executor fail quick-fuzz seed 277 with "a view of a leaf Variable ... in an in-place
# operation"; not landed.) Fixed: the gate keeps every rewrite in a graph where a write
# on one side of such a dropout meets a use on the other (SafetyGate::hidden_alias_read).
EVAL_DROPOUT_WRITE_REORDERED = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(16, 24) * 0.2041)
        self.b0 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.drop0 = torch.nn.Dropout(0.5)

    def forward(self, x, y):
        v0 = F.linear(y, self.w1, self.b0)
        v1 = F.elu(y)
        v2 = self.drop0(v1)
        F.hardsigmoid(v2, inplace=True)
        v3 = v2 * torch.sigmoid(1.702 * v2)
        v4 = v0 - v0
        v5 = self.fn0(v1)
        v6 = F.dropout(v4, p=0.1, training=True, inplace=True)
        return v5, v3 + v6.mean()

    def fn0(self, x):
        y = x * 1.0
        y.mul_(0.5)
        return y / (1.0 + torch.exp(-y))


def make():
    torch.manual_seed(205868)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 24, dtype=torch.float32), torch.randn(4, 24, dtype=torch.float32))
"""
# 210874: x * hardsigmoid(x) -> hardswish was 1 ulp off at saturation (aten's hardswish
# computes x * 6 / 6; the formula x * 1 exactly), and `where(v2 > v1, ...)` with v2 == v1
# flipped on that ulp: outputs 0.38 off, in fp64 too. canonicalize-activations now takes
# hardswish only in aten's grouping.
HARDSWISH_TIE_FLIP = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 16) * 0.2500)
        self.b0 = torch.nn.Parameter(torch.randn(8) * 0.1)

    def forward(self, x):
        v0 = F.linear(x, self.w0, self.b0)
        v1 = torch.addcmul(v0, v0, v0, value=0.5)
        v2 = v1 * F.hardsigmoid(v1)
        v3 = torch.where(v2 > v1, v2, v1 * 0.5)
        return v3,


def make():
    torch.manual_seed(210874)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 16, dtype=torch.float32),)
"""
# 208175: silu_ writes v0 after an unrolled loop reads v0 * (i + 1); once the region took
# the tail, the executor's DifferentiableGraph over the unrolled body kept v0 * 1, which
# its peephole turns into v0 itself, and silu_ then wrote it. Fixed: storage_root follows
# ops the peephole may fold to their input (SavedTensorAnalysis::may_fold_to_input), and
# the gate's executor chain follows loops with a constant trip count into their bodies.
UNROLLED_LOOP_KEEPS_WRITTEN_INPUT = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 8) * 0.3536)

    def forward(self, x):
        v0 = F.linear(x, self.w0)
        v1 = torch.zeros_like(v0)
        for i in range(2):
            v2 = v0 * (i + 1)
            v3 = v2 * torch.tanh(F.softplus(v2))
            v1 = v1 + v3
        v4 = F.silu(v0, inplace=True)
        v5 = v4 * torch.clamp(v4 + 3.0, 0.0, 6.0) / 6.0
        return v5 + v1


def make():
    torch.manual_seed(208175)
    m = P().to(torch.float32)
    m.eval()
    return m, (torch.randn(4, 8, dtype=torch.float32),)
"""


def test_eval_dropout_write_is_not_reordered(session):
    check(session, EVAL_DROPOUT_WRITE_REORDERED)


def test_hardswish_tie_flip(session):
    check(session, HARDSWISH_TIE_FLIP)


def test_unrolled_loop_keeps_written_input(session):
    check(session, UNROLLED_LOOP_KEEPS_WRITTEN_INPUT)


# Fixed: a region input whose history cannot be differentiated (rsqrt keeps its output,
# addcmul_ wrote it) is kept out of regions; one region op would send backward there.
def test_region_loop_after_written_rsqrt(session):
    check(session, RSQRT_WRITTEN_REGION_LOOP)


FRAC_REGION_GRADIENT_SILU = FRAC_REGION_GRADIENT.replace(
    "return x * 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))", "return x * torch.sigmoid(x)"
)


def test_frac_region_gradient_is_fp32_rounding(session):
    """144211 with x * sigmoid(x) for its erf GELU: silu is as accurate as the formula
    (measured over 4M points) but rounds differently, and the FracAct after it amplifies
    that: the fp32 gradients are 3.3e-4 apart where eager's own fp32 error is larger; the
    fp64 twin matches fp64 eager. Classified fp32-rounding (reported, not a failure)."""
    assert FRAC_REGION_GRADIENT_SILU != FRAC_REGION_GRADIENT
    res = session.run({"id": "regression", "source": HEADER + FRAC_REGION_GRADIENT_SILU})
    assert res["class"] == "fp32-rounding", (res["class"], res.get("detail"))


def test_frac_region_erf_gelu_is_exact(session):
    """144211 itself: its erf GELU became aten::gelu (less accurate on the CPU for x < -1)
    and was fp32-rounding; the formula now stays as written and the program passes."""
    res = session.run({"id": "regression", "source": HEADER + FRAC_REGION_GRADIENT})
    assert res["class"] == "ok", (res["class"], res.get("detail"))


def test_fp32_rounding_needs_the_same_function_in_fp64():
    """The judge's fp64 rule accepts no rewrite that changes the function: a program whose
    'rewritten' result is off by 2e-4 everywhere has an fp64 twin (through memslim.optimize,
    which leaves this program alone) equal to fp64 eager, but its fp32 error against fp64
    is far over 4 x eager's own."""
    import torch

    class Prog:
        @staticmethod
        def make():
            torch.manual_seed(0)
            m = torch.nn.Linear(8, 8)
            return m, (torch.randn(4, 8),)

    m, inputs = Prog.make()
    ref = runner.call(m, inputs, runner.trainable(m))
    R = runner.Reference("float32", ref, {k: 0.0 for k in ref}, [], False)
    bad = {k: v * (1 + 2e-4) for k, v in ref.items()}
    assert runner.compare(R, bad, 0) is not None
    assert not runner.fp64_twin_same(Prog, inputs, bad, R)


# Fixed: --verify compares both graphs unrolled when only the rewritten one hits the
# interpreter's loop limit.
def test_verify_runs_rewritten_loop_graph(session):
    check(session, VERIFY_REWRITTEN_FAILS)
