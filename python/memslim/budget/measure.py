"""What Inductor's partitioner keeps for backward, measured by a dry run.

What: _partitioned_saved_bytes (AOTAutograd traces the joint graph and Inductor's
partition_fn splits it, no code generated; the backward's saved inputs counted as
saved_tensors_hooks count them: _distinct_storage_bytes, each storage once, parameters'
out), _forget_fx_sources (drops the sources FX keeps for the dry runs' throwaway modules)
and _dynamic_output_shapes (the ShapeEnv setting the dry runs and the compile share).
Why its own module: every figure the compile way's budget planner decides by (its target,
each ladder probe, torch's knapsack, the chains' shares) is one of these dry runs.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from .. import fx
from ..cache_keys import _keyed_by_tags


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
