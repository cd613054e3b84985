"""Fuzz findings, minimized (see test_fuzz_regressions.py for how they run), that reach the
FX front end and memslim.compile: rewrites across no_grad blocks in both front ends, norms
and coupling chains, and the compile leg (with and without a memory budget).
Split from test_fuzz_regressions.py by topic; each file under the size rules."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import memslim
from fuzz_regression import REPO, check_corpus, runner, worker


@pytest.fixture(scope="module")
def session():
    yield from worker()


# Quick seeds 60 and 232 (2026-11-24, the generator's first no_grad blocks): rewrites that
# cover several nodes reached across a `with torch.no_grad()` boundary (the fused
# elu + dropout ran the elu with grad; x * sigmoid(x) with the sigmoid under no_grad became
# silu(x)), giving gradients eager never gives. Both front ends; the corpus holds the seeds.


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


def _compile_leg_session(budget: str, dynamic: bool = False, leg="MEMSLIM_FUZZ_COMPILE_BUDGET"):
    """A worker whose programs also run memslim.compile's leg with MEMSLIM_FUZZ_COMPILE_BUDGET
    = budget ("none": no budget; `dynamic`: MEMSLIM_FUZZ_COMPILE_DYNAMIC=1; `leg`
    MEMSLIM_FUZZ_COMPILE_PEAK: the peak leg at that fraction instead); the variables
    stay set until the fixture ends, since the worker reads them when it starts, at its
    first job."""
    names = {leg: budget, "MEMSLIM_FUZZ_COMPILE_DYNAMIC": "1"}
    if not dynamic:
        del names["MEMSLIM_FUZZ_COMPILE_DYNAMIC"]
    old = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    s = runner.Session(runner.default_memslim_opt(), cli=False, timeout=300)
    yield s
    s.close()
    for k, v in old.items():
        if v is None:
            del os.environ[k]
        else:
            os.environ[k] = v


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


# Compile leg, seed 940132 (2026-11-29, found by the budget-miss runs): memslim.compile's
# forward 0.2 off eager (w2's gradient 1.59) under the judge's fallback_random. Not the loss
# head (its input written in place by a dropout_ first; the head was refused a while): the
# program's unused dropout drew its mask after the in-place one's, Inductor's order edge to
# it lost (torch 2.14.1; memslim.inductor_guards' dropout_draw keeps it). The head is rewritten.
def test_compile_loss_head_after_inplace_dropout(compile_session):
    res = check_corpus(compile_session, "seed940132_compile_loss_head_after_inplace_dropout.py")
    assert res.get("budget") == "rewrites kept", res  # the head's rewrite reached Inductor


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


@pytest.fixture(scope="module")
def compile_budget_dynamic_session():
    """memslim.compile's leg with memory_budget=0.5 and dynamic=True."""
    yield from _compile_leg_session("0.5", dynamic=True)


# Compile leg with a budget and dynamic shapes, seed 941000 (2026-11-30): the planner inside
# the compile's partition step ran torch's knapsack on the compile's joint, where a size input
# is an int, and torch's size estimate raised (the step stopped). It plans the old way now.
def test_compile_budget_dynamic_knapsack_int_size(compile_budget_dynamic_session):
    check_corpus(
        compile_budget_dynamic_session, "seed941000_compile_budget_dynamic_knapsack_int_size.py"
    )


# Found by the same campaign (seeds 941000:941040, 0.5, dynamic; present before the planner
# moved into the partition step too): two budgets kept 1.10x / 1.09x the judge's target
# silently. Both: a coupling chain's block rebuilt off by more than coupling_drift_bound on
# its first call keeps its exact input from then on, bytes the plan did not count (data it
# cannot see before the call). The miss is said now: a record and a warning with its bytes,
# which account for the difference (the judge checks that).
@pytest.mark.parametrize("seed", ["941003", "941005"])
def test_compile_budget_dynamic_chain_drift_miss_is_said(compile_budget_dynamic_session, seed):
    res = check_corpus(compile_budget_dynamic_session, f"seed{seed}_compile_budget_dynamic_miss.py")
    assert res.get("budget", "").startswith("missed, said"), res


# Seed 941028, same campaign: a piece beside a coupling chain (chains._PerShape's static
# compile, real example inputs) was compiled by AOTAutograd in a fake mode of its own with no
# ShapeEnv, where memslim.norm_fallback's data-dependent size raised DynamicOutputShapeException
# (the step stopped). The piece is compiled with fakes of the backend's mode now.
def test_compile_budget_dynamic_norm_fallback_941028(compile_budget_dynamic_session):
    check_corpus(
        compile_budget_dynamic_session, "seed941028_compile_budget_dynamic_norm_fallback_shape.py"
    )


# Long-fuzz seeds 500804 and 501142 (2026-11-29, the 2,000-program run after the one-core
# restructuring; both also wrong at 7c33213, before it): affine coupling blocks with
# BatchNorm and dropout, through memslim.fx.optimize, a gradient 1.7e-4 / 2.8e-4 off (bar
# 1e-4). The class of 919812 / 924560 (known_failures.txt); not shrunk, not understood yet.
@pytest.mark.xfail(strict=True, reason="seed 500804: FX, affine coupling + BatchNorm + dropout")
def test_fx_affine_coupling_bn_group_norm_500804(session):
    check_corpus(session, "seed500804_affine_coupling_bn_group_norm_fx.py")


@pytest.mark.xfail(strict=True, reason="seed 501142: FX, affine coupling + BatchNorm + dropout")
def test_fx_affine_coupling_bn_dropout_501142(session):
    check_corpus(session, "seed501142_affine_coupling_bn_dropout_fx.py")


# Seed 941051, dynamic campaign at 0.5 (2026-11-30): a ladder step's dry run puts the step's
# tags on the shared joint by node provenance; Inductor's joint passes had left the tagged
# nodes (a fractional activation) with none, and the planner raised instead of measuring
# the step on a trace with its tags on (the step stopped).
def test_compile_budget_dynamic_retag_without_provenance(compile_budget_dynamic_session):
    check_corpus(
        compile_budget_dynamic_session, "seed941051_compile_budget_dynamic_retag_no_provenance.py"
    )


# Seed 941071 (and 941082), dynamic campaign at 0.5 (2026-11-30): a dry run re-partitioned a
# copy of a shared joint whose ladder step re-runs a random op, outside any fake mode or
# tracing context (a piece beside a coupling chain, compiled per shape): torch's
# functionalize_rng_ops asserted "fake_mode must not be None" and the step stopped.
def test_compile_budget_dynamic_rng_op_on_a_shared_joint(compile_budget_dynamic_session):
    check_corpus(
        compile_budget_dynamic_session, "seed941071_compile_budget_dynamic_rng_shared_joint.py"
    )


# Seed 941090, dynamic campaign (2026-11-30), the memslim.optimize (TorchScript) leg: x's
# gradient 0.0177 off eager's. TorchScript's common-subexpression elimination merges
# sigmoid(x) inside a `with torch.no_grad()` block with the one outside (the scripted
# gradient is eager's with the block made differentiable, to 2e-16); memslim had made the
# block's x * sigmoid(x) silu, so the merge took only part of it and the result matched
# neither. memslim.optimize now detaches what leaves the block: eager's gradient.
def test_optimize_no_grad_block_like_eager_941090(session):
    check_corpus(session, "seed941090_optimize_no_grad_scripted_ignores.py")


# Seed 941102, dynamic campaign at 0.5 (2026-11-30): a graph whose compile never called the
# planner inside the partition step; compile_planned read the plan it did not make (TypeError,
# the step stopped). Such a graph is planned the old way.
def test_compile_budget_dynamic_planner_never_called(compile_budget_dynamic_session):
    check_corpus(
        compile_budget_dynamic_session, "seed941102_compile_budget_dynamic_planner_never_called.py"
    )


@pytest.fixture(scope="module")
def compile_peak_session():
    """memslim.compile's peak leg (runner_peak.py) at 0.9 of the way to plain's step peak."""
    yield from _compile_leg_session("0.9", leg="MEMSLIM_FUZZ_COMPILE_PEAK")


# Seed 941181, the peak leg at 0.9 (2026-11-30): the graph was split around a coupling chain,
# no one planned its pieces under the peak target and no record said so: the step peaked at
# 3.6x plain torch.compile's, silently (`peak-miss`). Under a peak target chains stay with
# Inductor (a record says so) and the whole graph is planned: met.
def test_compile_peak_chain_graph_is_planned_941181(compile_peak_session):
    res = check_corpus(compile_peak_session, "seed941181_compile_peak_chain_unplanned.py")
    assert res.get("peak", "").startswith("met"), res
