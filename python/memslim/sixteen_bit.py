"""The backend's 16-bit rule: in a bf16 / fp16 graph, each rewriting pass must pay on its own.

What: `keep_paying_passes`, run by the torch.compile backend (without a memory budget) on a
graph that holds 16-bit floating tensors (torch.autocast, or a model cast to bf16 / fp16)
after the whole pipeline's rewrites were judged (kept where Inductor's partitioner keeps
fewer bytes with them, else the graph left to Inductor): each pass that rewrote a site is
left out in turn, on a fresh trace of the graph, and where Inductor's partitioner then keeps
no more bytes than with it, the pass stays out of the graph; its sites get a `kept` record
saying so, and one note per graph gives both figures. What is left is compiled where it
keeps fewer bytes than the unmodified graph (a subset of a pipeline that lost as a whole
can pay).
Why: a 16-bit rewrite is slower than Inductor's fused re-run (bench/results/op_speed*.md;
bench/results/autocast_bf16_2026-11-29.md), so one that frees nothing beyond Inductor's
own plan (fuse-gated-mlp in a bf16 decoder block) is a loss, which the core's price cannot
see. What autocast's casts do to a site the price now tells (passes/core/saved_tensors.cpp:
a 16-bit linear / conv keeps its cast copy of a float32 input), so a pass the price
refuses there (output-saving-norms on a float32 norm before a linear: 31,744 B more under
Inductor when it was priced as free) rewrites nothing and costs no dry run. Only 16-bit
graphs pay the dry runs.
"""

from __future__ import annotations

from typing import List

import torch

from .records import Decision, note

SIXTEEN = (torch.bfloat16, torch.float16)
# Passes that only bring sites into a canonical form for later passes: never left out alone.
_CANONICAL = ("canonicalize-activations", "canonicalize-norms", "functionalize-activations")


def sixteen_bit(graph: torch.fx.GraphModule) -> bool:
    """Whether a node of `graph` makes a bf16 / fp16 tensor (its fake value's dtype)."""
    for n in graph.graph.nodes:
        v = n.meta.get("val")
        vals = v if isinstance(v, (tuple, list)) else (v,)
        if any(isinstance(t, torch.Tensor) and t.dtype in SIXTEEN for t in vals):
            return True
    return False


def _kept(d: Decision, why: str) -> Decision:
    return Decision(
        {
            "pass": d.pass_,
            "verdict": "kept",
            "site": d.site,
            "text": why,
            "line": f"remark: {d.pass_}: kept {d.site}: {why}",
            "bytes_before": d.bytes_before,
            "bytes_after": d.bytes_before,
            "added_work": None,
            "rule": None,
        }
    )


def keep_paying_passes(gm, example_inputs, policy, passes: List[str], decisions, static=False):
    """Leaves out, one at a time, each pass of `passes` that rewrote a site in `decisions`
    (the pipeline's plan; its last record the backend's note of what Inductor's
    partitioner keeps without and with it). Returns None where every pass pays, else
    (aten graph with the paying passes' rewrites applied, its fake mode, fakes, decisions,
    whether any rewrite is left). static: backend._aten_graph's (a per-shape build)."""
    from . import fx
    from .backend import _aten_graph, _leaf_grad, _parameters
    from .budget.measure import _dynamic_output_shapes, _partitioned_saved_bytes

    last = decisions[-1]
    before, after = last.bytes_before, last.bytes_after
    if last.pass_ != "inductor-partition" or before is None or after is None:
        return None
    rewriting = [p for p in dict.fromkeys(d.pass_ for d in decisions if d.verdict == "rewrote")]
    current, best, dropped = list(passes), None, []
    for p in rewriting:
        if p in _CANONICAL or p not in current:
            continue
        trial = [q for q in current if q != p]
        aten, mode, fakes = _aten_graph(gm, example_inputs, static=static)
        serial = fx._Serializer(
            aten.graph, _leaf_grad(aten, example_inputs), _parameters(aten, example_inputs)
        )
        plan, apply, _, _ = fx._plan(
            aten, trial, policy, regions="tags", serial=serial, ladders="none"
        )
        with _dynamic_output_shapes(mode):
            apply()
            without = _partitioned_saved_bytes(aten, fakes)
        if without <= after:
            n = sum(d.pass_ == p and d.verdict == "rewrote" for d in decisions)
            dropped.append((p, n, after, without))
            current, after, best = trial, without, (aten, mode, fakes, plan)
    if best is None:
        return None
    aten, mode, fakes, plan = best
    out = list(plan)
    left = any(d.verdict == "rewrote" for d in plan) and after < before
    for p, n, with_it, without in dropped:
        cost = (
            "it adds bytes here: Inductor's partitioner keeps more with it than the core's "
            "price of its sites says"
            if without < with_it
            else "it frees nothing beyond Inductor's own plan, and its 16-bit kernels add time"
        )
        why = (
            f"16-bit graph: Inductor's partitioner keeps {without} B without this pass's "
            f"{n} rewrite(s), {with_it} B with them: {cost}"
        )
        out += [_kept(d, why) for d in decisions if d.pass_ == p and d.verdict == "rewrote"]
        out.append(
            note(p, f"left out of this graph: {why}", with_it, without),
        )
    out.append(
        note(
            "inductor-partition",
            f"Inductor's partitioner keeps {before} B without memslim's rewrites, {after} B "
            "with the passes that pay in 16-bit: "
            + ("rewrites kept" if left else "graph left to Inductor"),
            before,
            after,
        )
    )
    return aten, mode, fakes, out, left
