"""Torch's own activation_memory_budget: the partitioner options and its knapsack.

What: FUSED_RECOMPUTE (torch's "more aggressive" min-cut options, which the compile way's
planner partitions with under a budget), TORCH_KNAPSACK (torch.compile's defaults),
_torch_knapsack (way 2 of budget.ladder._meet_budget: torch's knapsack as a dry run at the
user's fraction, else at the largest smaller fraction on a grid whose plan meets the
target) and _draws_random_numbers (the ops that keep a graph out of way 2).
Why its own module: it is the one way of the planner whose plan is torch's, not memslim's
ladders; issue 12 holds memslim to torch.compile's bytes at each budget through it.
"""

from __future__ import annotations

import math

import torch

from .measure import _partitioned_saved_bytes


# The partitioner's options under a budget the unmodified graph does not meet: torch's
# "more aggressive" min-cut options (partitioners.py, choose_saved_values_set: the
# first plan its activation_memory_budget tries), which let the min-cut re-run any
# fusible op however far its use, however long its chain, and where the backward
# would materialise it. The dry runs and the compile use the same options.
FUSED_RECOMPUTE = {
    "ban_recompute_used_far_apart": False,
    "ban_recompute_long_fusible_chains": False,
    "ban_recompute_materialized_backward": False,
}


# torch.compile's own partitioner options (the defaults FUSED_RECOMPUTE turns off), for
# way 2 of _meet_budget, torch's knapsack at the user's fraction.
TORCH_KNAPSACK = {k: True for k in FUSED_RECOMPUTE}


# Way 2's fractions below the user's: multiples of 1 / KNAPSACK_GRID above 0 (at most
# six dry runs past the one at the user's fraction).
KNAPSACK_GRID = 32


def _torch_knapsack(aten, fakes, skip, frac, before, target, note, fits=None):
    """Way 2 of _meet_budget: torch's own activation_memory_budget knapsack
    (partitioners.choose_saved_values_set: the "aggressive" min-cut, then a knapsack
    over the nodes its min-cut banned, convolutions and matrix products included, that
    keeps the budget at the least estimated re-run time) as a dry run, first at the
    user's fraction: the plan torch.compile runs at that budget. Torch's fraction is of
    its own size estimate (above the graph inputs' size), not of what the partition
    measures, so it may keep far less than the target (the toy ResNet at 0.5: 0.25 of
    the partition) or more. Where it keeps more, the largest smaller fraction whose plan
    meets the target (bisection over the multiples of 1 / KNAPSACK_GRID above 0): at a
    smaller fraction the knapsack keeps no more by its own estimate, so that plan keeps
    less than torch.compile at the user's fraction, and it picks its re-runs by
    estimated time where the pieces ladder (way 3) is greedy per byte (2026-11-28,
    resnet50 at 0.25: torch's plan at 0.25 missed the target by 0.2%, and the ladder's
    plan ran x1.32 of eager against torch's x1.06). A fraction above the user's (an
    interpolation tried on 2026-11-28) is never tried: issue 12 holds memslim to
    torch.compile's bytes at each budget. Where torch's plan at the user's fraction
    keeps its default min-cut's bytes, its budget is inert (a note says so) and no
    smaller fraction is tried. `frac`: the user's fraction. Returns (fraction, measured
    bytes, bytes at the user's fraction), fraction None where no fraction meets the
    target (then the bytes are those at the smallest fraction tried). fits: whether a
    dry run meets the target (None: its saved bytes at most `target`)."""
    fits = fits or (lambda b: b <= target)
    from torch._functorch import config as functorch_config

    def keeps(f):
        # torch.compile's options: its default min-cut bans (the knapsack's fraction is
        # of what that min-cut keeps), not FUSED_RECOMPUTE's.
        with functorch_config.patch(**TORCH_KNAPSACK, activation_memory_budget=f):
            return _partitioned_saved_bytes(aten, fakes, skip)

    got = keeps(frac)
    if fits(got):
        return frac, got, got
    if got >= before:
        # choose_saved_values_set returns the default min-cut at every fraction above 0
        # where that min-cut's size estimate is at most the graph inputs', which count
        # the parameters (bert, gpt2, llama_small).
        note(
            f"torch's activation_memory_budget knapsack (way 2) keeps {got:,} B at "
            f"{frac:.3g}, its default min-cut's bytes: torch's budget does nothing on "
            "this graph (as where its size estimate of the graph inputs, parameters "
            "included, is above the min-cut's); smaller fractions not tried"
        )
        return None, got, got
    # Bisection over the fractions k / GRID, 1 <= k, below the user's: keeps(grid[lo])
    # meets the target, keeps(frac) does not. A grid the same for every budget keeps
    # the bytes monotone in it where torch's plans are: a smaller budget's largest grid
    # point meeting its target is at most a larger budget's. Fraction 0 is not on it:
    # there torch keeps only the graph's inputs and re-runs the whole forward in
    # backward, more work than the ladders below (bert, where torch's knapsack keeps
    # the default min-cut's bytes at every fraction above 0).
    lo, hi = 1, math.ceil(frac * KNAPSACK_GRID)
    if hi <= lo:
        return None, got, got
    lo_got = keeps(lo / KNAPSACK_GRID)
    if not fits(lo_got):
        return None, lo_got, got
    while hi - lo > 1:
        mid = (lo + hi) // 2
        mid_got = keeps(mid / KNAPSACK_GRID)
        if fits(mid_got):
            lo, lo_got = mid, mid_got
        else:
            hi = mid
    return lo / KNAPSACK_GRID, lo_got, got


# Dropouts whose arguments are (input, p, train): aten (and its decompositions, which
# Inductor runs) draws nothing where p == 0 or train is False.
_DROPOUTS = tuple(
    getattr(torch.ops.aten, name).default
    for name in (
        "dropout",
        "native_dropout",
        "feature_dropout",
        "alpha_dropout",
        "feature_alpha_dropout",
    )
)


def _draws_random_numbers(node: torch.fx.Node) -> bool:
    """Whether `node` draws from a generator: an op tagged nondeterministic_seeded,
    except a dropout with a constant p of 0 or train False and an attention with a
    constant dropout_p of 0 (the transformers models call both with p=0.0 when their
    configs set the rates to 0: bert's graph skipped way 2 for draws it never makes)."""
    if node.op != "call_function" or torch.Tag.nondeterministic_seeded not in getattr(
        node.target, "tags", ()
    ):
        return False
    if node.target in _DROPOUTS:
        args = list(node.args) + [None] * 3
        p, train = node.kwargs.get("p", args[1]), node.kwargs.get("train", args[2])
        if (isinstance(p, (int, float)) and p == 0) or train is False:
            return False
    if node.target is torch.ops.aten.scaled_dot_product_attention.default:
        # (query, key, value, attn_mask, dropout_p, ...)
        p = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
        if isinstance(p, (int, float)) and p == 0:
            return False
    return True
