"""torch.compile(model, backend="memslim"): memslim's decisions, then Inductor.

What: a torch.compile backend. Dynamo's graph is traced to aten ops above
autograd (make_fx, pre_dispatch: the ops a user wrote, not yet differentiated,
with FakeTensor shapes, symbolic under dynamic shapes), memslim.fx.optimize
rewrites it (the C++ decision core, the same decisions as the TorchScript
passes), and Inductor's compile_fx compiles the result: AOTAutograd then
differentiates the memslim ops through their own autograd, so the joint graph
holds memslim::activation_forward / activation_backward and the partitioner
saves the output + bits instead of the input. Everything else is Inductor's.
Recompute regions become recompute tags for Inductor's partitioner here, not
memslim's region op (AOTAutograd would inline the op; _region_tags_key says why).
Cache safety: the rewrite happens before Inductor sees the graph, so Inductor's
and AOTAutograd's caches key on the rewritten graph (memslim ops and their
arguments included); the policy is part of the graph it produces; the tags,
node metadata outside the keys, enter them through _region_tags_key's uuid.
`memslim.compile(model, **policy)` passes policy options; `torch.compile(...,
backend="memslim")` uses the defaults. The backend is registered under the
name "memslim" when memslim is imported, and through the
`torch_dynamo_backends` entry point.
If memslim fails on a graph, the graph is compiled by Inductor unchanged and a
warning says why (strict=True, or MEMSLIM_STRICT=1 as the tests set, raises).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import warnings
from typing import List

import torch

from . import fx
from . import _policy
from ._policy import policy_keywords
from . import records as records_store
from .records import Decision

# Decision records of every graph the backend compiled, in order (the newest
# last); memslim.compile's models also keep their own (memslim.report(model)).
_LOG: List[Decision] = []


def compiled_decisions() -> List[Decision]:
    """The decision records of every graph torch.compile(backend="memslim") compiled."""
    return list(_LOG)


@contextlib.contextmanager
def _dynamic_output_shapes(fake_mode):
    # activation_forward's exact list has a data-dependent length (an unbacked
    # size under fake tensors). Dynamo's ShapeEnv allows such ops only with
    # fullgraph=True; the graph memslim hands to Inductor holds them whatever
    # the user asked for, so allow them for this frame's ShapeEnv. The setting
    # stays: AOTAutograd compiles the backward lazily, at the first backward, and
    # with an activation_memory_budget its partitioner may recompute
    # activation_forward there (measured: resnet50_gelu at budget 0.5 failed
    # with DynamicOutputShapeException when the setting was restored).
    env = getattr(fake_mode, "shape_env", None)
    if env is not None and not env.allow_dynamic_output_shape_ops:
        env.settings = dataclasses.replace(env.settings, allow_dynamic_output_shape_ops=True)
    yield


def _aten_graph(gm: torch.fx.GraphModule, example_inputs):
    """Dynamo's graph as aten ops above autograd, placeholders in the same order; the
    fake mode and the fake inputs it was traced with."""
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    fakes = [n.meta.get("example_value") for n in placeholders]
    if any(f is None for f in fakes):  # not from Dynamo: fake the example inputs
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        mode = detect_fake_mode(example_inputs) or FakeTensorMode(shape_env=ShapeEnv())
        fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    mode = detect_fake_mode(fakes)
    with _dynamic_output_shapes(mode):
        return make_fx(gm, tracing_mode="symbolic", pre_dispatch=True)(*fakes), mode, fakes


def _nbytes(val) -> int:
    if not isinstance(val, torch.Tensor):
        return 0
    n = fx._hint(val.numel())
    return (n or 0) * val.element_size()


def _storage(val):
    """The storage a (fake) tensor views, as a hashable key; None for a non-tensor."""
    if not isinstance(val, torch.Tensor):
        return None
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return StorageWeakRef(val.untyped_storage())
    except Exception:  # noqa: BLE001  (a tensor without storage: count it by itself)
        return ("no storage", id(val))


def _distinct_storage_bytes(vals, exclude=frozenset()) -> int:
    """What saved_tensors_hooks count for `vals` (memslim.saved_bytes): each storage once,
    at its whole size, none in `exclude` (the parameters'). A saved view of a parameter
    (a Linear's transposed weight, which the partitioner saves for backward) is the
    parameter's storage: bert's unmodified partition counted 491 MB by its saved values'
    sizes, where the hooks count 152 MB: the ~340 MB between were such views."""
    seen, total = set(), 0
    for v in vals:
        key = _storage(v)
        if key is None or key in exclude or key in seen:
            continue
        seen.add(key)
        try:
            n = fx._hint(v.untyped_storage().nbytes())
        except Exception:  # noqa: BLE001
            n = None
        total += n if n is not None else _nbytes(v)
    return total


def _partitioned_saved_bytes(graph: torch.fx.GraphModule, fakes, skip=frozenset()) -> int:
    """What Inductor's partitioner keeps for backward on `graph`: AOTAutograd traces the
    joint graph and Inductor's partition_fn (its joint passes, then the min-cut
    rematerialization) splits it; no code is generated. The bytes of the backward
    graph's inputs other than the incoming gradients and the graph inputs whose
    positions are in `skip` (AOTAutograd's `primals_<position + 1>`: parameters, which
    the module keeps anyway), counted as saved_tensors_hooks count them: each storage
    once, at its size, views of the skipped inputs' storages excluded."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    box = {}

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = partition_fn(joint, joint_inputs, **kwargs)
        skipped = {f"primals_{i + 1}" for i in skip}
        params = {
            _storage(n.meta.get("val"))
            for n in joint.graph.find_nodes(op="placeholder")
            if n.name in skipped
        } - {None}
        box["bytes"] = _distinct_storage_bytes(
            [
                n.meta.get("val")
                for n in bw.graph.find_nodes(op="placeholder")
                if not n.name.startswith("tangents")
            ],
            params,
        )
        return fw, bw

    from torch._guards import detect_fake_mode
    from torch._inductor.virtualized import V

    # Inductor's joint passes read V.fake_mode (its seed pass for dropout builds
    # FakeTensors with it), which compile_fx installs and a dry run must too.
    # The compile's joint passes, the tags' too (_keyed_by_tags), so the dry run
    # partitions what the compile will.
    with V.set_fake_mode(detect_fake_mode(fakes)), _keyed_by_tags(graph), _forget_fx_sources(graph):
        aot_module_simplified(
            graph,
            fakes,
            fw_compiler=lambda g, _: g,
            bw_compiler=lambda g, _: g,
            partition_fn=partition,
            decompositions=select_decomp_table(),
        )
    return box.get("bytes", 0)


@contextlib.contextmanager
def _forget_fx_sources(keep: torch.fx.GraphModule):
    """Drops the generated source that FX keeps for every GraphModule compiled inside
    the block (torch.fx.graph_module._loader.eval_cache and its linecache entry, kept
    for the process's life), except `keep`'s and its submodules'. A dry run's joint,
    forward and backward modules are thrown away, their sources were not: with one
    dry run per probe (and a recompile per ladder step tagged) the planner's resident
    memory grew with the number of probes, so a smaller budget left more behind
    (resnet50 at 0.25: 32 sources, 6 MiB, where torch.compile leaves 11, 1.9 MiB;
    test_compile_budget.py counts them)."""
    import linecache

    loader = getattr(torch.fx.graph_module, "_loader", None)
    cache = getattr(loader, "eval_cache", None)
    if not isinstance(cache, dict):  # another torch: nothing to forget
        yield
        return
    before = set(cache)
    try:
        yield
    finally:
        live = {
            getattr(getattr(m.forward, "__code__", None), "co_filename", None)
            for m in keep.modules()
            if isinstance(m, torch.fx.GraphModule)
        }
        for key in set(cache) - before - live:
            cache.pop(key, None)
            linecache.cache.pop(key, None)


def _compile_passes() -> List[str]:
    """The FX front end's passes without fuse-activation-dropout: Inductor fuses dropout's
    mask generation into its own kernels and does not keep dropout's float noise, so the
    fused op (aten's RNG, an opaque kernel) cost more time than it freed bytes (measured:
    ViT-B/16 with dropout 0.1, -4.1% saved bytes at 1.61x torch.compile's step time;
    bench/results/compile_side_by_side.md)."""
    from . import _C

    return [p for p in _C.fx_default_passes() if p != "fuse-activation-dropout"]


def _region_tags_key(digest: str):
    """A CustomGraphPass that keys Inductor's and AOTAutograd's caches on the recompute
    regions memslim tagged.

    Under torch.compile a recompute region is applied as tags (node.meta["recompute"] =
    MUST_RECOMPUTE on the region's nodes): memslim's region op would be inlined by
    AOTAutograd (its backward is traced into the joint graph) and the partitioner would
    save the region's values again (measured: resnet18_frac kept what plain torch.compile
    keeps). Node metadata is not part of either cache's key, so the backend compiles a
    tagged graph with this pass added to Inductor's joint_custom_pre_pass slot (after any
    the user set): it changes nothing (the tags are already on the nodes) and its uuid(),
    part of both keys, names the tagged regions. (Built on call: importing memslim does
    not import Inductor.)"""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class RegionTagsKey(CustomGraphPass):
        def __call__(self, graph) -> None:
            pass

        def uuid(self):
            return ("memslim-region-tags", digest)

    return RegionTagsKey()


def _untag_placeholders():
    """A CustomGraphPass for Inductor's joint_custom_post_pass slot that takes recompute
    tags off the joint graph's placeholders. Inductor's joint passes percolate a replaced
    node's tags to its replacement and up through its inputs (pattern_matcher's
    percolate_tags; remove_noop_ops): a tagged `x * 1.0` at the top of a run, replaced
    by x, tagged the graph input x MUST_RECOMPUTE, and the partitioner then kept
    neither x nor what backward computes from it ("Node add_21 was invalid, but is
    output"; fuzz seed 926027). An input cannot be recomputed: untagged, it is kept
    where backward reads it."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class UntagPlaceholders(CustomGraphPass):
        def __call__(self, graph) -> None:
            for n in graph.find_nodes(op="placeholder"):
                n.meta.pop("recompute", None)
                n.meta.pop("ac_graph_id", None)

        def uuid(self):
            return ("memslim-untag-placeholders", 1)

    return UntagPlaceholders()


def _region_digest(graph: torch.fx.GraphModule) -> str:
    """Which nodes of `graph` carry recompute tags, as a hash (the cache key's part)."""
    import hashlib

    tags = [
        f"{n.name}:{n.meta['recompute']}:{n.meta.get('ac_graph_id')}"
        for n in graph.graph.nodes
        if "recompute" in n.meta
    ]
    return hashlib.sha256("\n".join(tags).encode()).hexdigest() if tags else ""


@contextlib.contextmanager
def _keyed_by_tags(graph: torch.fx.GraphModule):
    """Where `graph` carries recompute tags: Inductor's config with the keying pass
    (_region_tags_key) and the placeholder untagging (_untag_placeholders) added after
    the user's joint passes, for the compile and every dry-run partition alike."""
    digest = _region_digest(graph)
    if not digest:
        yield
        return
    from torch._inductor import config

    def users(slot):
        user = getattr(config, slot)
        return list(user) if isinstance(user, (list, tuple)) else ([user] if user else [])

    with config.patch(
        joint_custom_pre_pass=[*users("joint_custom_pre_pass"), _region_tags_key(digest)],
        joint_custom_post_pass=[*users("joint_custom_post_pass"), _untag_placeholders()],
    ):
        yield


def _leaf_grad(aten: torch.fx.GraphModule, example_inputs) -> dict:
    """Whether each placeholder requires grad: Dynamo guards on it, so it is known."""
    placeholders = list(aten.graph.find_nodes(op="placeholder"))
    return {
        p.name: bool(t.requires_grad)
        for p, t in zip(placeholders, example_inputs)
        if isinstance(t, torch.Tensor)
    }


def _parameters(aten: torch.fx.GraphModule, example_inputs) -> set:
    """The placeholders Dynamo lifted from the module's parameters (kept by the module)."""
    placeholders = list(aten.graph.find_nodes(op="placeholder"))
    return {
        p.name for p, t in zip(placeholders, example_inputs) if isinstance(t, torch.nn.Parameter)
    }


def _note(text: str, before, after, pass_: str = "inductor-partition") -> Decision:
    return Decision(
        {
            "pass": pass_,
            "verdict": "note",
            "site": "",
            "text": text,
            "line": f"remark: {pass_}: " + text,
            "bytes_before": before,
            "bytes_after": after,
            "added_work": None,
        }
    )


class BudgetError(ValueError):
    """A memory budget the backend cannot meet on a graph. Raised, not warned about:
    a graph compiled over the budget the user asked for would run out of memory later."""


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


def _meet_budget(aten, fakes, apply, ladder, plain, budget, skip, decisions):
    """memory_budget under torch.compile, measured on Inductor's own partition (the
    dry run above; parameters excluded): the target is `budget` of what the partitioner
    keeps for the unmodified graph (a fraction in (0, 1]; as torch's
    activation_memory_budget, a fraction of what plain torch.compile keeps) or `budget`
    bytes. Nothing is rewritten when the unmodified graph meets it. Else the partitioner
    runs with FUSED_RECOMPUTE (dry runs and compile alike), and the ways below are tried
    in order of the work they add; the first that meets the target is taken:
    1. Fused re-runs: the fewer bytes of (a) the unmodified graph under FUSED_RECOMPUTE
       (torch's own first plan under a budget) and (b) that plus the light end of
       `plain`, the pieces ladder over the unmodified graph (core/recompute_blocks.h,
       ApplyAs::Tags: each convolution or matrix product alone, each stretch of norms
       and activations between, priced as recompute tags): its last step that re-runs
       no convolution or matrix product, taken whole. Inductor fuses such re-runs into
       the backward's kernels (they read the kept input where the backward read the
       saved output: no kernel added), so the planner takes all of them at once, as
       torch's partitioner takes its most aggressive min-cut of fusible ops once that
       meets the budget. Before 2026-11-27 (40cfc51) the ladder was bisected from step 0 and
       stopped at the first step meeting the target: resnet50_frac kept 0.31 of eager
       at 0.5, torch.compile 0.10.
    2. Torch's own knapsack (_torch_knapsack): what torch.compile does with
       activation_memory_budget at the user's fraction, taken where its measured
       bytes meet the target (so memslim never keeps more than torch.compile at the
       same budget where torch's plan meets the target), else at the largest smaller
       fraction whose plan meets it (2026-11-28, d5fb906). Its solver picks
       the re-runs (convolutions and matrix products among them) at the least
       estimated time for the bytes, where the ladder below is greedy per byte: on
       resnet50 at 0.25 (2026-11-27, 40cfc51) both kept 58.6-58.7 MB, torch's at x1.06 of
       eager's step, the ladder's at x1.32; on the toy CNN at 0.25 the ladder's step
       peaked 16% above the unmodified graph's, torch's plan not at all.
    3. The rest of `plain` (steps re-running convolutions and matrix products, the
       cheapest per byte first): the first step meeting the target.
    4. The pipeline's rewrites alone (memslim's own ops decompose into aten in the
       joint graph and keep about what Inductor keeps without them, which is why the
       ladders over the unmodified graph come first).
    5. `ladder`, the whole-block ladder (ApplyAs::Op's prices) over the graph the
       pipeline left: slower per byte, but it reaches further (the pieces' greedy stops
       once the kept bytes are the whole predicted backward peak).
    A later way is taken only where the earlier cannot reach the target, so its bytes
    are below everything the earlier reaches: a smaller budget never keeps more. Way 2
    is the exception, its probes depend on the fraction: there the bytes are monotone
    where torch's knapsack keeps fewer bytes at a smaller fraction (its own size
    estimate is monotone; the measured storages are what bench/memory_budget.py checks;
    a smaller budget's fraction is at most a larger one's). On a
    ladder: the first step whose measured bytes meet the target, found by bisection
    over the steps (each probe is one dry-run partition), then back while the step
    before also meets it. Where measured bytes fall along a ladder, a smaller budget
    takes a later step (a recomputed dropout keeps the generator's state, 5 KB on the
    CPU, so on tiny graphs they can rise by that much along it). Returns whether the
    graph was rewritten and the partitioner options to compile it with; raises
    BudgetError naming the smallest reachable figure."""

    def note(text, before=None, after=None):
        decisions.append(_note(text, before, after, "memory-budget"))

    before = _partitioned_saved_bytes(aten, fakes, skip)
    target = int(budget * before) if budget <= 1 else int(budget)
    head = (
        f"budget {target:,} B of the {before:,} B Inductor's partitioner keeps for the "
        "unmodified graph (parameters excluded)"
    )
    if before <= target:
        note(head + ": met as it is, nothing rewritten", before, before)
        return False, {}
    from torch._functorch import config as functorch_config

    options = dict(FUSED_RECOMPUTE)  # way 2 sets torch.compile's own
    # Probes tag and retag `aten` (each a recompile) and dry-run it: of the sources FX
    # keeps, only aten's last one is still used.
    with functorch_config.patch(**FUSED_RECOMPUTE), _forget_fx_sources(aten):
        return _meet_budget_fused(
            aten,
            fakes,
            apply,
            ladder,
            plain,
            budget,
            skip,
            note,
            decisions,
            before,
            target,
            head,
            options,
        ), options


# Way 2's fractions below the user's: multiples of 1 / KNAPSACK_GRID above 0 (at most
# six dry runs past the one at the user's fraction).
KNAPSACK_GRID = 32


def _torch_knapsack(aten, fakes, skip, frac, before, target, note):
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
    target (then the bytes are those at the smallest fraction tried)."""
    from torch._functorch import config as functorch_config

    def keeps(f):
        # torch.compile's options: its default min-cut bans (the knapsack's fraction is
        # of what that min-cut keeps), not FUSED_RECOMPUTE's.
        with functorch_config.patch(**TORCH_KNAPSACK, activation_memory_budget=f):
            return _partitioned_saved_bytes(aten, fakes, skip)

    got = keeps(frac)
    if got <= target:
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
    if lo_got > target:
        return None, lo_got, got
    while hi - lo > 1:
        mid = (lo + hi) // 2
        mid_got = keeps(mid / KNAPSACK_GRID)
        if mid_got <= target:
            lo, lo_got = mid, mid_got
        else:
            hi = mid
    return lo / KNAPSACK_GRID, lo_got, got


# Dropouts whose arguments are (input, p, train): aten's decompositions (which
# Inductor runs) draw nothing where p == 0 or train is False.
_DROPOUTS = (torch.ops.aten.dropout.default, torch.ops.aten.native_dropout.default)


def _draws_random_numbers(node: torch.fx.Node) -> bool:
    """Whether `node` draws from a generator: an op tagged nondeterministic_seeded,
    except a dropout with a constant p of 0 or train False and an attention with a
    constant dropout_p of 0 (the transformers models call both with p=0.0 when their
    configs set the rates to 0: bert's graph skipped way 2 for draws it never makes)."""
    if node.op != "call_function" or torch.Tag.nondeterministic_seeded not in getattr(
        node.target, "tags", ()
    ):
        return False
    if node.target in _DROPOUTS and len(node.args) >= 3:
        p, train = node.args[1], node.args[2]
        if (isinstance(p, (int, float)) and p == 0) or train is False:
            return False
    if node.target is torch.ops.aten.scaled_dot_product_attention.default:
        # (query, key, value, attn_mask, dropout_p, ...)
        p = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
        if isinstance(p, (int, float)) and p == 0:
            return False
    return True


def _meet_budget_fused(
    aten, fakes, apply, ladder, plain, budget, skip, note, decisions, before, target, head, options
) -> bool:
    """_meet_budget's ways, under FUSED_RECOMPUTE; whether the graph was rewritten. Way
    2 sets `options` to torch.compile's own (TORCH_KNAPSACK and the fraction)."""

    def usable(lad):
        return lad is not None and not lad.why and len(lad.steps) >= 2

    def measure(lad, k, measured):
        if k not in measured:
            lad.tag(k)
            measured[k] = _partitioned_saved_bytes(aten, fakes, skip)
        return measured[k]

    def take(lad, k, measured, what):
        lad.tag(k)
        step = lad.steps[k]
        peak, flops, runs = step.peak, step.flops, step.runs
        note(
            head + f": {what}; ladder step {k} of {len(lad.steps) - 1}: "
            f"{len(runs) - lad.skipped} recomputed run(s) ({lad.segments} blocks), measured "
            f"{measured[k]:,} B; predicted backward peak {peak:,} B (from "
            f"{lad.steps[0].peak:,} B), added forward work {flops / 1e9:.3g} GFLOP; steps "
            "measured: " + ", ".join(f"{j}: {b:,} B" for j, b in sorted(measured.items())),
            before,
            measured[k],
        )
        for j in range(1, k + 1):
            note(
                f"step {j}: {lad.steps[j].move} -> predicted {lad.steps[j].kept:,} B, peak "
                f"{lad.steps[j].peak:,} B"
                + ("" if lad.steps[j].light else " (re-runs a convolution or matrix product)")
            )
        if lad.skipped:
            note(f"{lad.skipped} run(s) left out: they overlap the model's own checkpointing")

    def walk(lad, lo, measured, what):
        """The step of `lad` after `lo` to tag (None: it cannot reach the target; then
        the smallest it reaches is in `reached`); measured[lo] is known and over the
        target."""
        last = len(lad.steps) - 1
        if lo >= last or measure(lad, last, measured) > target:
            lad.tag(0)
            reached.append((measured[last], what))
            return None
        hi = last  # measured[lo] > target >= measured[hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if measure(lad, mid, measured) <= target:
                hi = mid
            else:
                lo = mid
        # Measured bytes need not fall at every step (a recomputed dropout keeps the
        # generator's state): the earliest step meeting the target next to the one found.
        while hi > 1 and measure(lad, hi - 1, measured) <= target:
            hi -= 1
        take(lad, hi, measured, what)
        return hi

    reached = []
    fused = _partitioned_saved_bytes(aten, fakes, skip)
    reached.append((fused, "Inductor's partitioner re-running every fusible op"))
    unmodified = "on the unmodified graph (the pipeline's rewrites left out)"
    light = 0
    measured = {0: fused}
    if usable(plain):
        light = max(k for k, step in enumerate(plain.steps) if step.light)
        if light >= 1:
            reached.append((measure(plain, light, measured), "re-running norms and activations"))
    best = min((light, 0), key=lambda k: (measured[k], k))
    if measured[best] <= target:
        if best == 0:
            if plain is not None:
                plain.tag(0)  # the light end's tags, measured above, off again
            note(
                head + f": met by Inductor's partitioner re-running every fusible op "
                f"(keeps {fused:,} B; the light end of memslim's pieces ladder: "
                f"{measured[light]:,} B)",
                before,
                fused,
            )
            return False
        take(
            plain,
            light,
            measured,
            unmodified + ", every re-run that holds no "
            "convolution or matrix product (Inductor fuses them into the backward's "
            f"kernels), taken whole (the partitioner alone: {fused:,} B)",
        )
        return True
    if plain is not None:
        plain.tag(0)  # the light end's tags off for torch's knapsack
    # Torch's knapsack may re-run a random op in backward, which draws again unless
    # Inductor's own seeds replay it (not under fallback_random: aten's generator moved
    # on; fuzz seed 930027, w0 0.63 off): graphs drawing random numbers skip way 2 (the
    # ladders' recompute tags keep the generator's state).
    seeded = next((n for n in aten.graph.nodes if _draws_random_numbers(n)), None)
    user = budget if budget <= 1 else target / before  # the fraction torch.compile gets
    frac, got, at_user = (
        (None, None, None)
        if seeded is not None
        else _torch_knapsack(aten, fakes, skip, user, before, target, note)
    )
    if seeded is not None:
        note(
            f"torch's knapsack (way 2) not tried: the graph draws random numbers "
            f"({seeded.target}), which its plan may draw again in backward"
        )
    if frac is not None:
        options.update(TORCH_KNAPSACK, activation_memory_budget=frac)
        lower = (
            ""
            if frac == user
            else (
                f", the largest fraction found whose plan meets the target (at {user:.3g}, "
                f"torch.compile's own plan keeps {at_user:,} B)"
            )
        )
        note(
            head + f": met by torch's own activation_memory_budget knapsack at {frac:.6g}"
            f"{lower} (keeps {got:,} B; the partitioner alone: {fused:,} B, with memslim's "
            f"norm and activation re-runs: {measured[light]:,} B)",
            before,
            got,
        )
        return False
    if got is not None:
        reached.append((got, "torch's activation_memory_budget knapsack"))
    if usable(plain) and walk(plain, light, measured, unmodified) is not None:
        return True
    piped = fused
    if any(d.verdict == "rewrote" for d in decisions):
        apply()
        piped = _partitioned_saved_bytes(aten, fakes, skip)
        reached.append((piped, "with the pipeline's rewrites"))
    if piped <= target:
        note(head + f": met by the pipeline's rewrites (keeps {piped:,} B)", before, piped)
        return True
    if (
        usable(ladder)
        and walk(ladder, 0, {0: piped}, f"the pipeline's rewrites keep {piped:,} B") is not None
    ):
        return True
    lad = ladder if ladder is not None else plain
    if not reached:
        why = lad.why if lad is not None and lad.why else "no block to recompute"
        raise BudgetError(
            f"memory_budget {budget:g} ({target:,} B of the unmodified partition's {before:,} B) "
            f"cannot be met: {why} ({lad.segments if lad is not None else 0} blocks found"
            + (f"; refused: {'; '.join(lad.refused[:3])}" if lad and lad.refused else "")
            + ")"
        )
    best, how = min(reached)
    raise BudgetError(
        f"memory_budget {budget:g} ({target:,} B of the unmodified partition's {before:,} B) "
        f"cannot be met: the smallest reachable is {best:,} B ({best / before:.3f} of the "
        f"unmodified; {how}, the whole ladder of "
        f"{lad.segments if lad is not None else 0} blocks without raising the "
        "predicted backward peak)"
    )


class _ChainPiece(torch.nn.Module):
    """A coupling chain's piece of the graph (_compile_with_chains), run eagerly as
    TorchScript: at its first call with a new signature (shapes, strides, dtypes,
    devices, requires_grad) the aten piece is traced (torch.jit.trace, on clones of the
    inputs and under a forked RNG: BatchNorm's running stats and the user's random
    stream are not moved by it) and memslim.optimize's pipeline runs on the trace, whose
    invertible-couplings pass makes it one memslim::coupling_chain op: autograd keeps
    the chain's two outputs and backward rebuilds each block's inputs. A trace is
    specialised to its shapes, hence one per signature. Without grad mode the aten
    piece runs as it is (nothing is kept for backward). If the trace or the pipeline
    fails, the aten piece runs as it is for that signature and a warning says why
    (strict: raises), as the backend does for a graph it cannot rewrite."""

    def __init__(
        self, gm: torch.fx.GraphModule, policy: dict, records: List[Decision], strict: bool = False
    ):
        super().__init__()
        self.gm = gm
        self.policy = policy
        self.records = records
        self.strict = strict
        self.by_signature = {}

    @staticmethod
    def _signature(args):
        return tuple(
            (tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad)
            if isinstance(a, torch.Tensor)
            else repr(a)
            for a in args
        )

    def _build(self, args):
        from .optimize import optimize, report

        clones = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
        devices = sorted({a.device.index or 0 for a in args if a.device.type == "cuda"})
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation
            traced = torch.jit.trace(self.gm, clones, check_trace=False, strict=False)
        keep = ("min_bytes", "max_added_work", "assume_numel", "dropout_mask_bytes")
        opt = optimize(
            traced, clones, **{k: v for k, v in self.policy.items() if k in keep and v is not None}
        )
        found = report(opt)
        if self.records is not None:
            self.records.extend(found)
        _LOG.extend(found)
        return opt

    def forward(self, *args):
        if not torch.is_grad_enabled():
            return self.gm(*args)
        sig = self._signature(args)
        fn = self.by_signature.get(sig)
        if fn is None:
            try:
                fn = self._build(args)
            except Exception as e:  # noqa: BLE001  (the user's training must go on)
                if self.strict or os.environ.get("MEMSLIM_STRICT") == "1":
                    raise
                warnings.warn(f"memslim: a coupling chain runs unchanged: {type(e).__name__}: {e}")
                fn = self.gm
            self.by_signature[sig] = fn
        return fn(*args)


class _Compiled(torch.nn.Module):
    """A piece compile_fx compiled, as a submodule of the split graph; `single`: the
    piece made one value, which its graph returns as a 1-tuple (AOTAutograd takes
    tuple outputs only)."""

    def __init__(self, fn, single: bool, grads):
        super().__init__()
        self.fn = fn
        self.single = single
        self.grads = grads  # per argument: whether it was compiled as needing grad

    def forward(self, *args):
        # A gradient the compiled piece would drop is a wrong result: refuse it loudly.
        for a, g in zip(args, self.grads):
            if not g and isinstance(a, torch.Tensor) and a.requires_grad:
                raise RuntimeError(
                    "memslim: internal error: a graph piece compiled without "
                    "gradient for an input that requires grad"
                )
        out = self.fn(*args)  # as Dynamo calls what a backend returns
        return out[0] if self.single else out


def _tuple_output(gm: torch.fx.GraphModule) -> bool:
    """Makes `gm` return a tuple; whether it returned one value before."""
    out = next(iter(gm.graph.find_nodes(op="output")))
    if isinstance(out.args[0], (tuple, list)):
        return False
    out.args = ((out.args[0],),)
    gm.recompile()
    return True


def _chain_levels(aten: torch.fx.GraphModule, chains):
    """split_module's partition of `aten` around coupling chains, run in numeric order:
    chain k's nodes (and the getitems of its multi-output nodes) -> 2k + 1; every other
    node the smallest even number at or after every partition it reads and, once a chain
    has started in program order, after that chain: a node keeps its place relative to
    every chain, except a pure one (no write, no random draw) that a later chain node
    reads, which moves before that chain when no write precedes it since the chain began
    (a write through a view is not an edge of the graph: review of 2026-11-27). None
    when a chain would read a value placed after it."""
    import operator

    owner = {}
    for k, (nodes, _, _) in enumerate(chains):
        for n in nodes:
            owner[n] = k
            for u in n.users:
                if u.op == "call_function" and u.target is operator.getitem:
                    owner[u] = k
    # The chains each non-chain node feeds (read by a chain node, transitively through
    # non-chain nodes).
    feeds = {}
    for n in reversed(list(aten.graph.nodes)):
        if n in owner:
            continue
        feeds[n] = set()
        for u in n.users:
            feeds[n] |= {owner[u]} if u in owner else feeds.get(u, set())

    def pure(n):
        schema = getattr(n.target, "_schema", None)
        if n.op != "call_function":
            return n.op in ("placeholder", "get_attr")
        if n.target is operator.getitem:
            return True
        return (
            schema is not None
            and not schema.is_mutable
            and not getattr(n.target, "is_nondeterministic", False)
            and torch.Tag.nondeterministic_seeded not in getattr(n.target, "tags", ())
        )

    level, floor, wrote = {}, 0, False
    for n in aten.graph.nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            level[n] = 0
            continue
        reads = max((level[a] for a in n.all_input_nodes), default=0)
        if n in owner:
            level[n] = 2 * owner[n] + 1
            if reads > level[n]:
                return None
            if level[n] > floor:
                floor, wrote = level[n], False
            continue
        lo = reads + reads % 2
        current = floor // 2 if floor % 2 else None  # the chain under way, if any
        if current is not None and current in feeds[n] and pure(n) and not wrote:
            level[n] = max(lo, floor - 1)  # just before the chain it feeds
        else:
            level[n] = max(lo, floor + floor % 2)
        if not pure(n):
            wrote = True
    return level


def _compile_with_chains(
    aten, mode, fakes, example_inputs, chains, chain_decisions, *, strict, records, policy
):
    """Dynamo's graph with coupling chains: `aten` split around them (split_module), each
    chain a _ChainPiece run eagerly through the TorchScript pass (the FX graph has no op
    that carries F and G as graphs), every other piece compiled by this backend as a
    graph of its own; autograd links the pieces. Under a memory budget the target is
    `budget` of what Inductor's partitioner keeps for the whole unmodified graph; the
    chains keep their outputs (the FX core's price; a block the first call finds
    drifting keeps its input too), and the other pieces share what is left of the
    target in proportion to what each keeps unmodified (each as a budget in bytes); a
    graph that meets the target unmodified is not split (the least added work is none).
    Returns the split graph module, or None when the chains are not split out (a remark
    says why)."""
    from torch.fx.passes.split_module import split_module

    def note(text, before=None, after=None):
        chain_decisions.append(_note(text, before, after, "invertible-couplings"))

    level = _chain_levels(aten, chains)
    placeholders = list(aten.graph.find_nodes(op="placeholder"))

    def static(val):
        return isinstance(val, torch.Tensor) and all(
            isinstance(d, int) for d in (*val.shape, *val.stride())
        )

    def switches_mode(n):  # grad mode or autocast: split_module keeps them in order only
        name = getattr(n.target, "__name__", str(n.target))
        return n.op == "call_function" and ("set_grad_enabled" in name or "autocast" in name)

    why = None
    if level is None:
        why = "a chain reads a value made after its first node"
    elif any(switches_mode(n) for n in aten.graph.nodes):
        # The split moves nodes that do not read a chain before it: across such a switch
        # they would run in another mode (fuzz seeds 929032, 929043, 929044).
        why = "the graph switches grad mode or autocast"
    elif not all(
        static(n.meta.get("val")) or not isinstance(n.meta.get("val"), torch.Tensor)
        for n in aten.graph.nodes
    ) or any(
        not isinstance(n.meta.get("val"), torch.Tensor)
        for n in aten.graph.nodes
        if n.op == "placeholder"
    ):
        # The pieces are compiled with static shapes in a fake mode of their own (their
        # symbols, unbacked ones of memslim's ops too, must not enter Dynamo's shape
        # environment: its guards failed on them), and a trace is specialised anyway.
        why = "the graph has dynamic shapes or non-tensor inputs"
    if why:
        note("coupling chains left to Inductor: " + why)
        return None
    budget = policy.get("memory_budget")
    if budget is not None:
        skip = {i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)}
        with _dynamic_output_shapes(mode):
            whole = _partitioned_saved_bytes(aten, fakes, skip)
        target = int(budget * whole) if budget <= 1 else int(budget)
        if whole <= target:  # the least added work: none
            note(
                f"memory_budget {budget:g}: the unmodified graph keeps {whole:,} B, within "
                f"the target {target:,} B: coupling chains left to Inductor",
                whole,
                whole,
            )
            return None
    split = split_module(aten, None, lambda n: level[n])
    # Run the pieces in numeric order (split_module's own order is any topological one:
    # a piece of writes only, with no edge to the next, could run after it).
    import operator

    calls = sorted(
        (n for n in split.graph.nodes if n.op == "call_module"),
        key=lambda n: int(n.target.rsplit("_", 1)[1]),
    )
    if any(
        n.op not in ("placeholder", "call_module", "output")
        and not (n.op == "call_function" and n.target is operator.getitem)
        for n in split.graph.nodes
    ):
        note("coupling chains left to Inductor: the split graph has other nodes")
        return None
    out = next(iter(split.graph.find_nodes(op="output")))
    for c in calls:
        out.prepend(c)
        for u in list(c.users):
            out.prepend(u)
    split.graph.lint()
    # A piece's example inputs: Dynamo's for the graph's inputs (parameters stay
    # Parameters: budgets exclude them), the aten graph's fake values for the rest (a
    # piece's placeholders are named after the nodes they stand for).
    # make_fx's values carry no autograd facts: a value needs grad where a value it is
    # made from does (a piece compiled for inputs without grad would cut the gradient).
    by_name = {n.name: n for n in aten.graph.nodes}
    top = {p.name: example_inputs[i] for i, p in enumerate(placeholders)}

    # A list-valued node (chunk, split) passes it on to its getitems (fuzz seed 929036:
    # a chunk read after the chain lost its gradient when only tensor values passed it).
    def floating(val):
        if isinstance(val, (list, tuple)):
            return any(floating(v) for v in val)
        return isinstance(val, torch.Tensor) and val.is_floating_point()

    grad = {}
    for n in aten.graph.nodes:
        if n.op == "placeholder":
            t = top[n.name]
            grad[n] = isinstance(t, torch.Tensor) and t.requires_grad
        else:
            grad[n] = floating(n.meta.get("val")) and any(
                grad.get(a, False) for a in n.all_input_nodes
            )

    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    piece_mode = FakeTensorMode(shape_env=ShapeEnv())

    def example(name):
        t = top.get(name)
        if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor):
            return t  # Dynamo's real input (a Parameter stays one)
        node = by_name[name]
        val = node.meta["val"]
        if not isinstance(val, torch.Tensor):
            return val
        with piece_mode:
            out = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device)
        return out.requires_grad_(grad[node])

    n_chain = len(chains)
    pieces = []  # (name, module, its example inputs, is_chain, returns one value)
    for n in split.graph.nodes:
        if n.op != "call_module":
            continue
        sub = getattr(split, n.target)
        ins = [example(p.name) for p in sub.graph.find_nodes(op="placeholder")]
        is_chain = int(n.target.rsplit("_", 1)[1]) % 2 == 1
        single = False if is_chain else _tuple_output(sub)
        pieces.append((n.target, sub, ins, is_chain, single))
    piece_budget = {}
    if budget is not None:
        kept = {}
        with _dynamic_output_shapes(piece_mode):
            for name, sub, ins, is_chain, _ in pieces:
                if not is_chain:
                    faked = [
                        piece_mode.from_tensor(t)
                        if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor)
                        else t
                        for t in ins
                    ]
                    kept[name] = _partitioned_saved_bytes(
                        sub,
                        faked,
                        {i for i, t in enumerate(ins) if isinstance(t, torch.nn.Parameter)},
                    )
        chained = sum(after for _, _, after in chains)
        rest = target - chained
        total = sum(kept.values())
        for name, b in kept.items():
            piece_budget[name] = None if rest >= total or b == 0 else max(2, int(rest * b / total))
        note(
            f"memory_budget {budget:g}: target {target:,} B of the {whole:,} B Inductor's "
            f"partitioner keeps for the unmodified graph; {n_chain} coupling chain(s) keep "
            f"their outputs ({chained:,} B); the other {len(kept)} piece(s) keep "
            f"{total:,} B unmodified and "
            + ("need no budget" if rest >= total else f"share {max(rest, 0):,} B"),
            whole,
            None,
        )
    else:
        note(
            f"{n_chain} coupling chain(s) split out of the graph: each runs as "
            "memslim::coupling_chain through the TorchScript pass (traced at its first "
            "call), the other pieces are compiled by Inductor"
        )
    for name, sub, ins, is_chain, single in pieces:
        if is_chain:
            setattr(split, name, _ChainPiece(sub, policy, records, strict))
            continue
        sub_policy = dict(policy)
        if budget is not None:
            sub_policy["memory_budget"] = piece_budget[name]
        # A tracing context of its own: AOTAutograd records each compile's metadata
        # in it (Dynamo keeps one for the whole graph), and a piece compiled in the
        # graph's context read the graph's (IndexError in its runtime wrapper).
        # Inductor's caches off for the pieces: a piece whose graph matched another
        # model's piece (same ops, a weight of another shape) was served that piece's
        # code (size assertion at run time; found in the 2026-11-27 tests, not understood).
        from torch._functorch import config as functorch_config
        from torch._inductor import config as inductor_config

        try:
            with (
                torch._guards.tracing(torch._guards.TracingContext(piece_mode)),
                inductor_config.patch(fx_graph_cache=False),
                functorch_config.patch(enable_autograd_cache=False),
            ):
                fn = backend(sub, ins, strict=strict, records=records, _chains=False, **sub_policy)
        except BudgetError as e:  # the unsplit graph's ways may still meet it
            note(
                f"coupling chains left to Inductor: with {n_chain} chain(s) keeping "
                f"{chained:,} B a piece of the graph cannot keep within its share of "
                f"{target:,} B ({e})"
            )
            return None
        setattr(
            split,
            name,
            _Compiled(fn, single, [isinstance(t, torch.Tensor) and t.requires_grad for t in ins]),
        )
    split.recompile()
    return split


def backend(
    gm: torch.fx.GraphModule,
    example_inputs,
    *,
    strict: bool = False,
    records: List[Decision] = None,
    _chains: bool = True,
    **policy,
):
    """The torch.compile backend (registered as "memslim").

    Inductor's partitioner itself recomputes pointwise ops (every activation is on its
    list), so a rewrite that pays in eager may not pay here: when the graph needs
    gradients, both versions are partitioned (no code generated) and the rewritten one is
    compiled only if Inductor then keeps fewer bytes for backward; otherwise the graph goes
    to Inductor unchanged and one "note" record says so. Every graph goes to compile_fx with
    memslim's Inductor guards (inductor_guards.config_patches)."""
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    from . import inductor_guards

    policy = _policy.check("memslim backend", policy)
    budget = policy.get("memory_budget")
    options = {}  # the partitioner's, for the compile (a budget's FUSED_RECOMPUTE)
    try:
        aten, mode, fakes = _aten_graph(gm, example_inputs)
        needs_grad = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
        )
        # The graph as the core reads it, once: the chains, the pipeline and the budget's
        # plain ladder all run over it before anything changes the graph.
        serial = fx._Serializer(
            aten.graph, _leaf_grad(aten, example_inputs), _parameters(aten, example_inputs)
        )
        if _chains and needs_grad:
            chain_decisions, chains = fx.coupling_chains(aten, policy, serial=serial)
            split = None
            if chains:
                split = _compile_with_chains(
                    aten,
                    mode,
                    fakes,
                    example_inputs,
                    chains,
                    chain_decisions,
                    strict=strict,
                    records=records,
                    policy=policy,
                )
            # What a chain became is the TorchScript pass's record (at the chain's first
            # call), or the note saying why the chains stayed with Inductor.
            chain_decisions = [d for d in chain_decisions if d.verdict != "rewrote"]
            if chains or any(d.verdict != "note" for d in chain_decisions):
                _LOG.extend(chain_decisions)
                if records is not None:
                    records.extend(chain_decisions)
            if split is not None:
                return split
        decisions, apply, ladder, _ = fx._plan(
            aten, _compile_passes(), policy, regions="tags", serial=serial
        )
        rewrote = any(d.verdict == "rewrote" for d in decisions)
        if budget is not None and needs_grad:
            skip = {i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)}
            # The pieces ladder over the unmodified graph (no pass run): tried first.
            _, _, _, plain = fx._plan(aten, [], policy, regions="tags", serial=serial)
            with _dynamic_output_shapes(mode):
                rewrote, options = _meet_budget(
                    aten, fakes, apply, ladder, plain, budget, skip, decisions
                )
        elif rewrote and needs_grad:
            # One trace: partitioned as it is, then with the rewrites applied.
            with _dynamic_output_shapes(mode):
                before = _partitioned_saved_bytes(aten, fakes)
                apply()
                after = _partitioned_saved_bytes(aten, fakes)
            rewrote = after < before
            decisions.append(
                _note(
                    f"Inductor's partitioner keeps {before} B without memslim's rewrites, {after} B "
                    f"with them: " + ("rewrites kept" if rewrote else "graph left to Inductor"),
                    before,
                    after,
                )
            )
        elif rewrote:
            # Nothing is kept for backward in a graph without gradients: the memslim ops
            # would only replace Inductor's fused activations by library calls.
            rewrote = False
            decisions.append(
                _note(
                    "no gradients in this graph (nothing is kept for backward): "
                    "graph left to Inductor",
                    None,
                    None,
                )
            )
    except BudgetError:
        raise
    except Exception as e:  # noqa: BLE001  (the user's training must go on)
        if strict or os.environ.get("MEMSLIM_STRICT") == "1":
            raise
        warnings.warn(f"memslim: graph compiled by Inductor unchanged: {type(e).__name__}: {e}")
        return compile_fx(gm, example_inputs, config_patches=inductor_guards.config_patches())
    _LOG.extend(decisions)
    if records is not None:
        records.extend(decisions)
    guards = inductor_guards.config_patches()  # Inductor's own passes kept right
    with functorch_config.patch(**options):
        if not rewrote:
            return compile_fx(gm, example_inputs, config_patches=guards)
        with _dynamic_output_shapes(mode), _keyed_by_tags(aten):
            return compile_fx(aten, example_inputs, config_patches=guards)


@policy_keywords("memslim.compile")
def compile(
    model,
    *,
    strict: bool = False,
    fullgraph: bool = False,
    dynamic=None,
    mode=None,
    options=None,
    policy: dict,
):
    """torch.compile(model, backend="memslim") with memslim's policy keywords (every
    entry point's, below; ValueError when out of range). fullgraph / dynamic: as torch.compile's.
    memslim.report(result) gives the decision records of the graphs compiled so far.
    memory_budget: each compiled graph keeps at most this fraction (in (0, 1]) of what
    Inductor's partitioner keeps for it unmodified (parameters excluded: the fraction
    torch's activation_memory_budget is of), or this many bytes (> 1); see
    _meet_budget. An unreachable budget raises (BudgetError, inside Dynamo's
    BackendCompilerFailed) naming the smallest reachable figure."""
    if mode is not None or options is not None:
        raise ValueError(
            "memslim.compile: mode/options are Inductor's; set them with "
            "torch._inductor.config.patch(...) around the call"
        )
    records: List[Decision] = []
    be = functools.partial(backend, strict=strict, records=records, **policy)
    compiled = torch.compile(model, backend=be, fullgraph=fullgraph, dynamic=dynamic)
    records_store.remember(compiled, records)
    return compiled


def _register() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "memslim" not in _COMPILER_FNS:
        register_backend(name="memslim")(backend)
