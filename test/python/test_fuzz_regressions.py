"""Findings of the differential program fuzzer (test/fuzz, issue 9), minimized.

Each case is a fuzzer program (a module plus `make()`) run through every stage of
test/fuzz/runner.py in a worker subprocess (a crash fails the test instead of killing
pytest): eager, the scripted module, memslim.optimize and memslim-opt --verify, outputs
and every gradient against eager. Findings not fixed yet are marked
`xfail(strict=True)`: once fixed they pass, strict turns that red, and the mark goes.
Fixed findings stay here as plain tests, or live in test/fuzz/corpus/ (the fuzz_quick ctest
runs those).
"""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "test", "fuzz"))

import runner  # noqa: E402

HEADER = """import math

import torch
import torch.nn.functional as F
"""


@pytest.fixture(scope="module")
def session():
    s = runner.Session(runner.default_memslim_opt(), cli=True, timeout=300)
    yield s
    s.close()


def check_source(session, source: str) -> dict:
    res = session.run({"id": "regression", "source": source})
    assert res["class"] == "ok", "%s@%s: %s (stages: %s)" % (
        res["class"],
        res.get("stage"),
        res.get("detail"),
        res.get("stages"),
    )
    return res


def check(session, body: str):
    check_source(session, HEADER + body)


def check_corpus(session, name: str) -> dict:
    """A minimized finding kept as a corpus file (the fuzz_quick ctest runs it too)."""
    with open(os.path.join(REPO, "test", "fuzz", "corpus", name)) as f:
        return check_source(session, f.read())


# Long-fuzz seed 600035 (2026-11-24), minimized: a hand-written LayerNorm of exactly
# constant rows. Eager's formula gives x - mean = 0, so gamma's gradient is exactly 0;
# canonicalize-norms' aten::layer_norm of x (one-pass moments) left x_hat ~1e-5 there and
# the gradient read 2.5e-5. Fixed on 2026-11-24 (bdf6efc): the formula's centring stays and
# layer_norm normalises x - mean.
def test_hand_layer_norm_of_constant_rows(session):
    check_corpus(session, "seed600035_hand_layer_norm_constant_row.py")


# Seeds 4, 9, ... (27 of seeds 0:320): memslim.optimize raised AttributeError: 'bool'
# object has no attribute 'detach' for a bool forward argument. Fixed on main (791c883);
# memslim-opt --input-shapes takes such values since then too.
BOOL_ARG = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)

    def forward(self, x, b: bool):
        h = F.linear(x, self.w0)
        if b:
            h = F.gelu(h)
        return h


def make():
    torch.manual_seed(0)
    return P(), (torch.randn(8, 16), True)
"""

# Seeds 5, 15, ... (21 of 0:320): the same for an int argument. Fixed on main (791c883).
INT_ARG = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)

    def forward(self, x, k: int):
        h = F.linear(x, self.w0)
        for i in range(k):
            h = F.silu(h) * 0.5 + h
        return h


def make():
    torch.manual_seed(0)
    return P(), (torch.randn(8, 16), 2)
"""

# Seeds 47, 59, ... (15 of 0:320): the same for a float argument. Fixed on main (791c883).
FLOAT_ARG = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)

    def forward(self, x, s: float):
        h = F.linear(x, self.w0)
        return F.gelu(h) * s


def make():
    torch.manual_seed(0)
    return P(), (torch.randn(8, 16), 1.5)
"""

# Seed 99 (class rng-order): two dropouts of one value, the second feeding
# x * sigmoid(x). From the optimizing executor's second call on, the optimized module
# draws the two masks in swapped order (its outputs equal eager's with the two dropout
# lines swapped; the unmodified scripted module keeps eager's order; with
# torch.jit.optimized_execution(False) every call matches eager). Not a wrong result:
# the executor's doing, reproduced without memslim (docs/facts.md).
DROPOUT_ORDER = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(24, 8) * 0.3536)
        self.drop0 = torch.nn.Dropout(0.1)

    def forward(self, x):
        v0 = F.linear(x, self.w0)
        v1, v2 = v0.chunk(2, dim=1)
        v3 = F.dropout(v2, 0.1, True)
        v3.clamp_(-3.0, 3.0)
        v4 = self.drop0(v2)
        v5 = torch.sigmoid(v4)
        v6 = v4 * v5
        return v6 + v1.sum() * 0.0 + v5.mean(), v2 + v3.sum() * 0.0


def make():
    torch.manual_seed(99)
    m = P()
    m.train()
    return m, (torch.randn(4, 8),)
"""


def test_bool_forward_argument(session):
    check(session, BOOL_ARG)


def test_int_forward_argument(session):
    check(session, INT_ARG)


def test_float_forward_argument(session):
    check(session, FLOAT_ARG)


# Seed 73 (memslim-opt stage, quick-run seed listed in test/fuzz/known_failures.txt):
# memslim-opt --verify refuses the unmodified graph ("memslim-opt: error: --verify: the
# input graph fails on the example inputs: Expected Tensor but got None") though eager,
# the scripted module and memslim.optimize all run it; the same with --passes=cleanup.
# x * v0 instead of x - v0, or no loop, and it passes.
VERIFY_LOOP_SUB_DROPOUT = """
class P(torch.nn.Module):
    def forward(self, x):
        v0 = torch.zeros_like(x)
        for i in range(2):
            v0 = v0 + x
        return F.dropout(x - v0, 0.2, True)


def make():
    torch.manual_seed(73)
    return P(), (torch.randn(4, 16),)
"""


# Fixed: torch's interpreter fails on it unoptimized; --verify compares the graphs unrolled.
def test_verify_loop_sub_dropout(session):
    check(session, VERIFY_LOOP_SUB_DROPOUT)


# Long-mode seeds 100242, 100265, 100315, ... (bench/results/fuzz_long.md): canonicalize-
# activations turns x * relu6(x + 3) / 6 into aten::hardswish although its result is
# written in place later; TorchScript's executor differentiates aten::hardswish in a
# DifferentiableGraph that keeps its output (plain TorchScript does the same for
# F.hardswish / F.softplus / F.leaky_relu followed by an in-place write: eager trains),
# so backward fails "modified by an inplace operation ... output 0 of DifferentiableGraph"
# (train: from the executor's second call on; eval: from the first). The unmodified
# formula keeps only its intermediates and trains.
HARDSWISH_WRITTEN_AFTER = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)

    def forward(self, x):
        v0 = F.linear(x, self.w0)
        v1 = v0 * F.relu6(v0 + 3.0) / 6.0
        v1.sub_(0.25)
        return v1


def make():
    torch.manual_seed(0)
    m = P()
    m.train()
    return m, (torch.randn(8, 8),)
"""

# Long-mode seed 100134: in eval mode F.dropout(h, p, self.training) returns h itself
# (eager and TorchScript's interpreter alike), but aten::dropout's schema declares no
# alias, so AliasDb, and the gate, see a fresh tensor: output-saving-activations rewrites
# the gelu whose output h is then written through the dropout's result (d.add_), and
# backward fails "modified by an inplace operation ... output 0 of
# CppNode<memslim::ActivationFunction>".
EVAL_DROPOUT_ALIAS = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)

    def forward(self, x):
        h = F.gelu(F.linear(x, self.w0))
        d = F.dropout(h, 0.2, self.training)
        d.add_(1.0)
        return F.leaky_relu(h, 0.2) + d


def make():
    torch.manual_seed(0)
    m = P()
    m.eval()
    return m, (torch.randn(8, 8),)
"""


# Long-mode seed 100483, same root cause (eval-mode dropout returns its input): nn.Dropout's
# `training` is a submodule attribute, so the dropout stays in the graph;
# functionalize-inplace-activations sees tanh_'s input d as a fresh tensor with no other
# use and makes it tanh, so h is no longer written: outputs 61% off (the unmodified scripted
# module matches eager). A wrong result.
EVAL_DROPOUT_FUNCTIONALIZE = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        h = F.linear(x, self.w0)
        d = self.drop(h)
        t = torch.tanh_(d)
        return h, t


def make():
    torch.manual_seed(0)
    m = P()
    m.eval()
    return m, (torch.randn(4, 16),)
"""

# Long-mode seed 100480, same root cause, memslim-opt stage: with --passes=cleanup alone,
# DCE (AliasDb) deletes `torch.tanh_(d)` whose result is unused, though d is h; --verify
# (the interpreter, node by node) reports "outputs within 1.5". TorchScript's own executor
# drops that write too (the unmodified scripted module differs from eager; memslim.optimize
# matches it), so memslim-opt's archive equals the scripted module, but the rewrite changed
# what the graph computes under the interpreter.
EVAL_DROPOUT_DCE = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(16, 16) * 0.25)

    def forward(self, x):
        h = F.linear(x, self.w0)
        d = F.dropout(h, 0.5, self.training)
        torch.tanh_(d)
        return h


def make():
    torch.manual_seed(0)
    m = P()
    m.eval()
    return m, (torch.randn(4, 16),)
"""


# Long-mode seed 100751: a dropout whose result is unused still draws random numbers;
# memslim-opt deletes it, so the next dropout's mask changes and --verify, which seeds
# both runs alike, reports "outputs within 0.24". Since main's conservative cleanup
# (311b0a0) the pass keeps it, but the driver's preparation (inlining, constant
# propagation's DCE) still deletes it: --passes=<any single pass> fails the same way. TorchScript's executor deletes
# it too (memslim-opt's archive equals the unmodified scripted module), so users see no
# change, but --verify fails on every graph with a dead random op.
VERIFY_DEAD_DROPOUT = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop0 = torch.nn.Dropout(0.1)

    def forward(self, x):
        v0 = x[:, 1:]
        v1 = F.dropout(v0, 0.1, True)
        v2 = self.drop0(v0)
        return v0 + v2


def make():
    torch.manual_seed(0)
    m = P()
    m.train()
    return m, (torch.randn(8, 16),)
"""


# Fixed: optimize() pins unused random ops through ConstantPropagation's DCE
# (long-mode seeds 100774, 101208 were the same).
def test_verify_dead_dropout(session):
    check(session, VERIFY_DEAD_DROPOUT)


# Long-mode seeds 100684, 101854, ... same root cause, recompute-pointwise-regions: the
# region (tanh-GELU + addcdiv) re-reads v0 in backward after v1.mul_ wrote it through the
# eval-mode dropout: outputs 34% off from the first call (the unmodified scripted module
# goes wrong the same way from the executor's second call: TorchScript trusts the schema too).
EVAL_DROPOUT_REGION = """
class P(torch.nn.Module):
    def forward(self, x):
        v0 = F.gelu(x, approximate='tanh')
        v1 = F.dropout(v0, 0.5, self.training)
        v1.mul_(0.5)
        v2 = torch.addcdiv(v0, x, v0.abs() + 1.0, value=0.3)
        return v1 + v2


def make():
    torch.manual_seed(0)
    m = P()
    m.eval()
    return m, (torch.randn(8, 16),)
"""

# Long-mode seed 100315: functionalize-inplace-activations makes sigmoid_ functional, so
# sigmoid -> leaky_relu now land in one DifferentiableGraph, whose leaky_relu keeps its
# output (as for hardswish above; plain TorchScript fails on F.leaky_relu(v) followed by an
# in-place write too); the later relu_ on that output breaks backward ("output 0 of
# DifferentiableGraph"). The unmodified module (sigmoid_ in place) trains.
FUNCTIONALIZE_LEAKY = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(16, 24, bias=True)
        self.w1 = torch.nn.Parameter(torch.randn(8, 24) * 0.2041)

    def forward(self, x):
        v0 = self.lin0(x)
        v1 = torch.sigmoid_(v0)
        v2 = F.leaky_relu(v1, 0.2)
        torch.relu_(v2)
        return v2 @ self.w1.t()


def make():
    torch.manual_seed(0)
    m = P()
    m.eval()
    return m, (torch.randn(8, 16),)
"""


# Long-mode seed 101387 (memslim-opt stage): memslim-opt --verify fails with "gradients
# within 0.000317" (bar 1e-4) on its own random inputs; output-saving elu and mish are
# the cause (the pipeline without output-saving-activations passes). On other inputs the
# error reaches 1.3e-4 in grad:s0 (the 0-dim parameter behind the FracAct formula) and
# 5.5e-5 in the input's gradient, where the unmodified scripted module is exact: the
# output-saving inversions' rounding, amplified downstream, is at the edge of the bar.
OUTPUT_SAVING_NUMERICS = """
class P(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 24) * 0.2041)
        self.w1 = torch.nn.Parameter(torch.randn(8, 8) * 0.3536)
        self.w2 = torch.nn.Parameter(torch.randn(16, 8) * 0.3536)
        self.s0 = torch.nn.Parameter(torch.tensor(1.00))

    def forward(self, x):
        v0 = F.linear(x, self.w0)
        v1 = F.elu(v0)
        v2 = F.hardsigmoid(v1, inplace=True)
        v3 = torch.matmul(v1, self.w1.t())
        v4 = v2.reshape(32, 2)
        v5 = torch.tanh(F.softplus(v4)) * v4
        v6 = v5.reshape(8, 8)
        v7 = torch.matmul(v6, self.w2.t())
        v8 = v7 * self.s0
        t13_a = torch.sigmoid(self.s0) * 1.8 + 0.1
        t13_p = torch.where(v7 > 0, v7, 1.0)
        t13_p = 1.0507 * torch.pow(t13_p, 1 - t13_a) / torch.exp(torch.lgamma(2 - t13_a))
        t13_q = torch.where(v7 <= 0, v7, 1.0)
        t13_g = torch.exp(torch.lgamma(1 + t13_a))
        t13_acc = (1 - torch.exp(t13_q)) * t13_g / torch.exp(torch.lgamma(1 + t13_a))
        t13_acc = t13_acc - (1 - torch.exp(t13_q - 1.0)) * t13_g / torch.exp(torch.lgamma(t13_a))
        v9 = torch.where(v7 > 0, t13_p, 1.7581 / torch.pow(1.0, t13_a) * t13_acc)
        return v6, v8 + v8.sum() * 0.1, v9


def make():
    torch.manual_seed(101387)
    m = P()
    m.eval()
    return m, (torch.randn(8, 24),)
"""


def test_output_saving_gradient_within_verify_bar(session):
    check(session, OUTPUT_SAVING_NUMERICS)


# The same program in training mode (long-mode seed 101387 itself): --verify measured
# gradients within 1.03e-4 of the input graph (bar 1e-4) where the input graph is itself
# that far from its float64 run; --verify now allows 4x the input graph's own rounding.
def test_output_saving_gradient_within_input_graphs_rounding(session):
    check(
        session,
        OUTPUT_SAVING_NUMERICS.replace("m.eval()", "m.train()").replace(
            "torch.manual_seed(101387)", "torch.manual_seed(101387)"
        ),
    )


def test_eval_dropout_alias_region(session):
    check(session, EVAL_DROPOUT_REGION)


# Fixed: functionalize guards what autodiff may compute from the functional output.
def test_functionalize_exposes_leaky_relu_output_write(session):
    check(session, FUNCTIONALIZE_LEAKY)


def test_eval_dropout_alias_functionalize(session):
    check(session, EVAL_DROPOUT_FUNCTIONALIZE)


def test_eval_dropout_alias_dce(session):
    check(session, EVAL_DROPOUT_DCE)


def test_canonical_hardswish_written_after(session):
    check(session, HARDSWISH_WRITTEN_AFTER)


def test_eval_dropout_alias_written_after(session):
    check(session, EVAL_DROPOUT_ALIAS)


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


def test_dropout_mask_order_is_rng_order_only(session):
    """TorchScript's optimizing executor moves independent dropouts around nodes autodiff
    cannot differentiate (docs/facts.md); memslim's ops are such nodes. Allowed:
    the masks may come in another order, but with the executor not optimizing every call
    must match eager (the runner's rng-order class checks exactly that)."""
    res = session.run({"id": "regression", "source": HEADER + DROPOUT_ORDER})
    assert res["class"] in ("ok", "rng-order"), "%s@%s: %s" % (
        res["class"],
        res.get("stage"),
        res.get("detail"),
    )


def test_runner_catches_a_wrong_result(session):
    """The harness itself: a program whose optimized module must differ is impossible to
    write from outside memslim, so check the judge on a tensor pair instead."""
    import torch

    ref = {"out:0": torch.ones(4)}
    R = runner.Reference("float32", ref, {"out:0": 0.0}, [], False)
    assert runner.compare(R, {"out:0": torch.ones(4)}, 0) is None
    assert runner.compare(R, {"out:0": torch.ones(4) * (1 + 2e-4)}, 0)["tensor"] == "out:0"
    nan = torch.tensor([1.0, float("nan")])
    R = runner.Reference("float32", {"out:0": nan}, {}, [], False)
    assert (
        runner.compare(R, {"out:0": torch.tensor([1.0, 0.0])}, 0) is not None
    )  # NaN must stay NaN


def test_runner_isolates_a_crash(session):
    """A worker that dies is blamed on its program, and the next program still runs."""
    crash = "import os, signal\n\ndef make():\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    res = session.run({"id": "crash", "source": crash})
    assert res["class"] == "crash" and "SIGSEGV" in res["detail"] and res["stage"] == "load"
    check(
        session, FLOAT_ARG.replace("x, s: float", "x").replace(" * s", "").replace(", 1.5)", ",)")
    )


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


# Quick seeds 60 and 232 (2026-11-24, the generator's first no_grad blocks): rewrites that
# cover several nodes reached across a `with torch.no_grad()` boundary (the fused
# elu + dropout ran the elu with grad; x * sigmoid(x) with the sigmoid under no_grad became
# silu(x)), giving gradients eager never gives. Both front ends; the corpus holds the seeds.
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import memslim  # noqa: E402


class _TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)


class _NoGradDropout(_TwoLinears):
    def forward(self, x):
        h = self.a(x)
        with torch.no_grad():
            e = F.elu(h, alpha=0.5)
        return self.b(F.dropout(e, 0.1, self.training) + h)


class _NoGradSigmoid(_TwoLinears):
    def forward(self, x):
        h = self.a(x)
        with torch.no_grad():
            s = torch.sigmoid(h)
        return self.b(h * s)


class _NoGradCseTwin(_TwoLinears):
    # Long-fuzz seed 401503 (2026-11-24): the hand-written mish under no_grad became
    # mish(h), beside the user's mish(h) outside; TorchScript's CSE merged them and
    # the block's value carried a gradient.
    def forward(self, x):
        h = self.a(x)
        m = F.mish(h)
        with torch.no_grad():
            n = h * torch.tanh(F.softplus(h))
        return self.b(F.softplus(n, beta=2.0, threshold=5.0) + m)


@pytest.mark.parametrize("model_fn", [_NoGradDropout, _NoGradSigmoid, _NoGradCseTwin])
@pytest.mark.parametrize("front_end", ["torchscript", "fx", "fx_pre_dispatch"])
def test_no_rewrite_reaches_across_a_no_grad_block(model_fn, front_end):
    # torch.export wraps the block in a higher-order op (opaque to memslim); make_fx's
    # pre-dispatch graph (torch.compile's backend) has _set_grad_enabled nodes instead.
    x = torch.randn(8, 16)
    model = model_fn().train()

    def grads(m):
        for p in m.parameters():
            p.grad = None
        torch.manual_seed(1)
        m(x).square().sum().backward()
        return [p.grad.clone() for p in m.parameters()]

    want = grads(model)
    if front_end == "torchscript":
        opt = memslim.optimize(model_fn().train(), (x,))
    elif front_end == "fx":
        opt = memslim.fx.optimize(torch.export.export(model_fn().train(), (x,))).module()
    else:
        from torch.fx.experimental.proxy_tensor import make_fx

        m = model_fn().train()
        opt = memslim.fx.optimize(make_fx(m, pre_dispatch=True)(x))
        opt.parameters = m.parameters  # the graph reads m's parameters
    for g, w in zip(grads(opt), want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


# Long-fuzz seed 700679 (2026-11-24), shrunk: BatchNorm1d over channels that are exactly
# constant in the batch; the FX front end's output-saving batch_norm rebuilt x_hat from
# aten's rounded y (y = x * scale + shift carries u |mean| rstd, rstd = 1 / sqrt(eps)) and
# gave gamma a 1.6e-5 gradient where eager's is exactly 0. Fixed on 2026-11-25 (91f4146): channels
# with |mean| rstd over the bound keep their x_hat (norm_fallback).
def test_bn_output_saving_of_constant_channels(session):
    check_corpus(session, "seed700679_bn_output_saving_constant_channel.py")


# Fuzz seed 916549 (2026-11-25), shrunk: a coupling-shaped block whose BatchNorm1d sees
# channels that are exactly constant (hardsigmoid(0) * 30 on a zeros input); the FX front
# end's output-saving batch_norm gives gamma a 8.9e-3 gradient where eager's is exactly 0.
# The same class as seed 700679 above; found again by the 2026-11-25 run of 3000 seeds,
# unchanged with the fused region loop off (MEMSLIM_REGION_KERNEL=0). Fixed with it.
def test_bn_output_saving_of_constant_channels_in_coupling(session):
    check_corpus(session, "seed916549_bn_constant_channels_in_coupling.py")


# Long-fuzz seed 701167 (2026-11-24), shrunk: a hand-written LayerNorm of rows constant to
# rounding; aten's layer_norm re-centres the formula's x - mean, the formula does not. Not
# fixed (known_failures.txt).
@pytest.mark.xfail(
    strict=True, reason="seed 701167: canonicalized hand LayerNorm, near-constant rows"
)
def test_hand_layer_norm_of_near_constant_rows(session):
    check_corpus(session, "seed701167_hand_layer_norm_near_constant_row.py")


# Long-fuzz seed 800836 (2026-11-24), shrunk: a coupling chain on the pieces of a
# transposed input, linked through chunk(cat(...)), with dropout in its last G. The chain
# passed the first block's outputs to the next block as they were (transposed layout)
# instead of the link's pieces (row-major), so the last G's dropout drew its mask in
# another memory order: forward and gradients differed. Fixed: links give the pieces, and
# replays of random functions get their input in the forward's layout.
def test_coupling_chain_dropout_after_transposed_input(session):
    check_corpus(session, "seed800836_coupling_dropout_transposed_input.py")


# Quick-fuzz seed 88 (2026-11-24), shrunk: a coupling chain whose input is exactly zero
# (y - y), BatchNorm over constant channels inside F / G and a 30x gain. memslim.optimize and
# the FX front end pass; memslim-opt --verify on the saved archive reports fp32 gradients off
# by 3e-3 (1.1 unshrunk). It appeared once coupling links handed the next block the link's
# pieces (seed 800836's fix). Not understood yet (known_failures.txt).
@pytest.mark.xfail(
    strict=True, reason="seed 88: coupling chain on a zero input, memslim-opt --verify"
)
def test_coupling_chain_on_zero_input_cli_verify(session):
    check_corpus(session, "seed88_coupling_bn_zero_input_cli_verify.py")


# Long-fuzz seed 900440 (2026-11-24), shrunk: a coupling chain (BatchNorm inside G,
# LayerNorm inside F) on the pieces of LayerNorm(relu_(rms_norm(x))) * g. memslim.optimize's
# gradient of the LayerNorm before the chain was off (norm0.bias rel 17.9, with 1 thread).
# Row 7 of x is all negative, so relu_ zeroes it and the first block's x2 row is exactly 0;
# rebuilt, it is 1e-7 noise, F's layer_norm over 4 elements scales that by 1/sqrt(eps) and
# the ReLU6 after it turns on: the input gradient there was 112 where eager's is 1. The
# first-call check compared values only. Fixed (2026-11-25, 0cef10d): it also compares F's / G's
# gradients at the rebuilt and the exact input, beyond what relative noise of the same size
# does, and block 0 keeps its input.
def test_coupling_chain_after_layer_norm_input_gradient(session):
    check_corpus(session, "seed900440_coupling_bn_layer_norm_input_grad.py")


# Long-fuzz seed 912289 (2026-11-24), shrunk: fp64 LayerNorm(x * sigmoid(x)).mean().
# Eager's mean is exactly 0; after silu canonicalization memslim's is 6.9e-18, an
# ulp-level difference through a cancelling sum that the comparison reads as relative
# error inf. Present at 346d549 (known_failures.txt).
@pytest.mark.xfail(
    strict=True, reason="seed 912289: fp64 cancelling mean after silu canonicalization"
)
def test_silu_layer_norm_mean_of_zero_fp64(session):
    check_corpus(session, "seed912289_silu_layer_norm_mean_zero_fp64.py")


# Long-fuzz seed 912100 (2026-11-24), shrunk: a coupling chain whose G is linear(layer_norm
# over 2 elements). The rebuilt input passes the drift check; the 2-element LayerNorm
# turns its rounding into w3's gradient off by 1.28e-4 (bar 1e-4). Present at 346d549.
# The gradient check of 0cef10d (2026-11-25) sees F's parameter gradient off by 5.5e-6 at a
# random cotangent (bound 1e-5); the two blocks' contributions to w3 cancel to 1.28e-4 of the
# sum. 2026-11-27: passes on an Intel Xeon with AVX-512 (the machine used then), failed on the
# AMD EPYC machines used 2026-11-24 to 2026-11-25: at 1.28e-4 against a bar of 1e-4 the verdict
# is the CPU's vector rounding. Not strict: reported as XPASS where it passes and XFAIL where
# it fails (known_failures.txt lists it); fixing it still means making it strict again.
@pytest.mark.xfail(
    strict=False,
    reason="seed 912100: coupling chain through a 2-element "
    "LayerNorm (at the bar's edge: passes on some CPUs)",
)
def test_coupling_chain_through_a_two_element_layer_norm(session):
    check_corpus(session, "seed912100_coupling_layer_norm_of_two.py")


# Fuzz seeds 919516, 919812 and 922186 (2026-11-25, 3000 seeds 919500:922500): three
# `wrong` verdicts present with every change then new (2026-11-25) turned off (and with the
# fused region loop off). Not fixed yet (known_failures.txt); see each corpus file's header.
# 2026-11-27: passes on an Intel Xeon with AVX-512, as 912100 above (1.3e-4 against 1e-4
# on the AMD EPYC used 2026-11-25).
@pytest.mark.xfail(
    strict=False,
    reason="seed 919516: fused activation-dropout in a coupling "
    "(at the bar's edge: passes on some CPUs)",
)
def test_fused_dropout_silu_in_coupling(session):
    check_corpus(session, "seed919516_fused_dropout_silu_in_coupling.py")


@pytest.mark.xfail(strict=True, reason="seed 919812: coupling chains behind a scalar gain")
def test_coupling_chain_scalar_gain(session):
    check_corpus(session, "seed919812_coupling_chain_scalar_gain.py")


@pytest.mark.xfail(strict=True, reason="seed 922186: hand LayerNorm, a zero gradient as 2e-7")
def test_hand_layer_norm_shift_grad_zero(session):
    check_corpus(session, "seed922186_hand_layer_norm_shift_grad_zero.py")


# Fuzz seed 924560 (2026-11-25, 3000 seeds 922500:925500, the first with affine couplings):
# a Glow half's rebuilt input is off by 2e-7 relative, and a cancelling weight gradient
# amplifies it past the bar (the class of 919812). Not fixed (known_failures.txt).
@pytest.mark.xfail(strict=True, reason="seed 924560: Glow half, a cancelling weight gradient")
def test_glow_coupling_cancelling_weight_grad(session):
    check_corpus(session, "seed924560_glow_coupling_cancelling_weight_grad.py")


# Fuzz seed 927093 (2026-11-27, the compile-budget leg): an in-place activation under
# no_grad (`v20 = v19.tanh_()`, read afterwards) on a tensor that requires grad. The FX
# front end's functionalize-inplace-activations made it tanh(v19), a tensor with no
# autograd history, and memslim.compile's gradients lost the path through v19 (w1 0.98
# off in fp32 and bf16; plain memslim.compile kept the rewrite because a recompute region
# made the graph keep fewer bytes). The TorchScript gate already refused it (prim::Exit
# between the nodes). Run here through memslim.compile, which the quick fuzz does not.
def test_inplace_activation_under_no_grad_through_compile(session):
    import importlib.util

    import torch
    from torch._inductor import config as inductor_config

    import memslim

    name = "seed927093_inplace_activation_under_no_grad.py"
    check_corpus(session, name)
    spec = importlib.util.spec_from_file_location(
        "seed927093", os.path.join(REPO, "test", "fuzz", "corpus", name)
    )
    prog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prog)

    def grads(wrap):
        model, (x,) = prog.make()
        model = model.float()
        x = x.float().requires_grad_(True)
        outs = wrap(model)(x)
        w = torch.Generator().manual_seed(5)
        sum((o * torch.randn(o.shape, generator=w)).sum() for o in outs).backward()
        return [x.grad] + [p.grad for p in model.parameters() if p.grad is not None]

    with inductor_config.patch(fallback_random=True):
        want = grads(lambda m: m)
        torch._dynamo.reset()
        got = grads(lambda m: memslim.compile(m, strict=True))
        torch._dynamo.reset()
    assert len(got) == len(want)
    for g, e in zip(got, want):
        assert float((g - e).norm() / e.norm()) < 1e-5


def _compile_leg_session(budget: str):
    """A worker whose programs also run memslim.compile's leg with MEMSLIM_FUZZ_COMPILE_BUDGET
    = budget ("none": no budget); the variable stays set until the fixture ends, since the
    worker reads it when it starts, at its first job."""
    old = os.environ.get("MEMSLIM_FUZZ_COMPILE_BUDGET")
    os.environ["MEMSLIM_FUZZ_COMPILE_BUDGET"] = budget
    s = runner.Session(runner.default_memslim_opt(), cli=False, timeout=300)
    yield s
    s.close()
    if old is None:
        del os.environ["MEMSLIM_FUZZ_COMPILE_BUDGET"]
    else:
        os.environ["MEMSLIM_FUZZ_COMPILE_BUDGET"] = old


@pytest.fixture(scope="module")
def compile_session():
    """memslim.compile's leg without a budget."""
    yield from _compile_leg_session("none")


# Compile leg, seed 929001 (2026-11-27): memslim.compile splits the coupling chain out;
# the piece before it holds memslim ops with unbacked sizes, which broke Dynamo's guards
# while the pieces were compiled in its shape environment (a fake mode of their own now).
def test_compile_chain_beside_exact_list(compile_session):
    res = check_corpus(compile_session, "seed929001_compile_chain_beside_exact_list.py")
    assert res.get("chains", 0) >= 1, res  # the chain was split out and rewritten


# Compile leg, seed 929036 (2026-11-27): a chunk made before the chain is read after it; the
# split marked its pieces as needing no gradient (requires_grad was propagated through
# tensor values only, not through chunk's list), and the gradient through them was lost.
def test_compile_chain_grad_through_chunk(compile_session):
    res = check_corpus(compile_session, "seed929036_compile_chain_grad_through_chunk.py")
    assert res.get("chains", 0) >= 1, res


# Compile leg, seed 929032 (2026-11-27; 929043 and 929044 alike): a no_grad region beside a
# coupling chain; splitting moved nodes across the grad-mode switch (split_module refused).
def test_compile_chain_beside_no_grad(compile_session):
    check_corpus(compile_session, "seed929032_compile_chain_beside_no_grad.py")


@pytest.fixture(scope="module")
def compile_budget_session():
    """memslim.compile's leg with memory_budget=0.3."""
    yield from _compile_leg_session("0.3")


# Compile leg with a budget, seed 930027 (2026-11-28): torch's own knapsack (the planner's way
# 2) re-ran a dropout in backward, which under fallback_random draws another mask from aten's
# generator (w0 0.63 off). A graph drawing random numbers does not take way 2.
def test_compile_budget_knapsack_keeps_dropout_masks(compile_budget_session):
    check_corpus(compile_budget_session, "seed930027_compile_budget_knapsack_redraws_dropout.py")


# Compile leg with a budget, seed 930021 (2026-11-28): split around the coupling chain,
# outputs were 0.106 and w0's gradient 0.395 off eager, with or without a budget. First memslim
# refused to split graphs writing in place into their own values; then (30873c5) the cause was
# found in Inductor: the first piece ended in add_(linear(x, w0), x, alpha=0.5), and torch 2.14.1's
# add(mm, c) -> addmm pattern drops add's alpha (plain torch.compile too). The backend's
# post-grad guard (memslim.inductor_guards) moves alpha off such adds; the refusal is gone.
def test_compile_budget_chain_with_dropout(compile_budget_session):
    check_corpus(compile_budget_session, "seed930021_compile_budget_chain_dropout_wrong.py")
