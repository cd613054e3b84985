"""Inductor's cache keys for the recompute tags memslim puts on a graph.

What: TAG_KEYS / tags_of / set_tags (a node's recompute tags), LADDER_TAGGED (the node
metadata marking a ladder step's tags), _region_digest
(which nodes carry recompute tags, as a hash), _region_tags_key (a
CustomGraphPass whose uuid is that digest, so that Inductor's and AOTAutograd's caches key
on the tags), _untag_placeholders (takes tags off the joint graph's inputs) and
_keyed_by_tags (Inductor's config with both added after the user's joint passes, for the
compile and every dry-run partition alike).
Why its own module: the compile (backend), the partition dry runs (budget.measure) and the
chain pieces all key on the same tags; node metadata is part of neither cache's key.
"""

from __future__ import annotations

import contextlib

import torch


# Node metadata key on the nodes a budget ladder step tagged (fx.BlockLadder.tag): its
# value is the node's recompute tags before (a dict, maybe empty). The dry runs
# (budget.measure) trace a graph without them and put them on a copy of its joint.
LADDER_TAGGED = "memslim_ladder_tagged"

# The node metadata a recompute tag is (torch.utils.checkpoint's and the partitioner's).
TAG_KEYS = ("recompute", "ac_graph_id")


def tags_of(node) -> dict:
    """`node`'s recompute tags (TAG_KEYS present on it)."""
    return {k: node.meta[k] for k in TAG_KEYS if k in node.meta}


def set_tags(node, tags: dict) -> None:
    """`node`'s recompute tags made `tags` (those absent from it taken off)."""
    for k in TAG_KEYS:
        node.meta.pop(k, None)
        if k in tags:
            node.meta[k] = tags[k]


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
                set_tags(n, {})

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

    from .inductor_guards import pass_slot

    with config.patch(
        joint_custom_pre_pass=pass_slot(
            [*users("joint_custom_pre_pass"), _region_tags_key(digest)]
        ),
        joint_custom_post_pass=pass_slot([*users("joint_custom_post_pass"), _untag_placeholders()]),
    ):
        yield
