"""What Inductor's partitioner keeps for backward, measured by a dry run.

What: _partitioned_saved_bytes (AOTAutograd traces the joint graph and Inductor's
partition_fn splits it, no code generated; the backward's saved inputs counted as
saved_tensors_hooks count them: _distinct_storage_bytes, each storage once, parameters'
out; the figure is a Partition, an int that also carries the forward's and backward's
live-bytes peaks the step-peak predictor reads: _live_peak), _forget_fx_sources (drops the sources FX keeps for the dry runs' throwaway modules)
and _dynamic_output_shapes (the ShapeEnv setting the dry runs and the compile share).
Why its own module: every figure the compile way's budget planner decides by (its target,
each ladder probe, torch's knapsack, the chains' shares) is one of these dry runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Optional, Sequence

import torch

from .. import fx
from ..cache_keys import LADDER_TAGGED, _keyed_by_tags, set_tags, tags_of


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
        total += _storage_nbytes(v)
    return total


class Partition(int):
    """A dry run's saved bytes (the int) with what the step-peak predictor
    (budget.model, peak_memory=) reads of the same partition: `fw_peak`, the forward
    graph's highest live bytes (its saved tensors and outputs included, the graph's
    inputs not); `bw_peak`, the backward's (its saved inputs and incoming gradients live
    from its start, each freed after its last use, as AOTAutograd's backward clears
    them); `outputs`, the forward's outputs that are not saved for backward; `grads`, the
    parameters' gradients the backward makes; `flops`, the matrix products' and
    convolutions' floating-point operations of the forward and the backward together
    (_graph_flops: a plan's added work is its flops less the unmodified graph's; re-runs
    of pointwise ops count nothing, Inductor fuses them into the backward's kernels).
    Arithmetic gives plain ints."""

    fw_peak: int = 0
    bw_peak: int = 0
    outputs: int = 0
    grads: int = 0
    flops: int = 0

    def profile(self) -> dict:
        return {k: getattr(self, k) for k in ("fw_peak", "bw_peak", "outputs", "grads", "flops")}

    @classmethod
    def of(cls, saved: int, profile: Optional[dict] = None) -> "Partition":
        p = cls(saved)
        for k, v in (profile or {}).items():
            setattr(p, k, int(v))
        return p


def _pointwise(node) -> bool:
    t = node.target
    return node.op == "call_function" and torch.Tag.pointwise in getattr(t, "tags", ())


# Ops Inductor lowers as a copy of their first input written in place (its index_put /
# scatter lowerings: clone, then the stores): the copy takes the buffer of a first input
# that dies there, as a pointwise op's output does (an embedding's gradient, full(0) then
# an accumulating index_put, is one buffer).
_WRITES_OVER_FIRST = frozenset(
    {
        "index_put",
        "_unsafe_index_put",
        "_unsafe_masked_index_put_accumulate",
        "index_add",
        "index_copy",
        "scatter",
        "scatter_add",
        "scatter_reduce",
    }
)


def _writes_over_first(node) -> bool:
    packet = getattr(node.target, "overloadpacket", None)
    return node.op == "call_function" and getattr(packet, "__name__", "") in _WRITES_OVER_FIRST


def _reduction(node) -> bool:
    t = node.target
    return node.op == "call_function" and torch.Tag.reduction in getattr(t, "tags", ())


def _fused(node, outputs) -> bool:
    """Whether Inductor leaves `node` unmaterialised (an approximation of its fusion):
    a pointwise op that is no output and whose only user is a pointwise op or a
    reduction, which compute it inline."""
    if node in outputs or not _pointwise(node) or len(node.users) != 1:
        return False
    (user,) = node.users
    return _pointwise(user) or _reduction(user)


def _live_peak(graph: torch.fx.Graph, start: Sequence = (), resident=frozenset()) -> int:
    """The highest bytes of live storages while `graph` runs: the placeholders in
    `start` live from the beginning (the backward's saved tensors and incoming
    gradients), each storage freed after the last node reading it unless it is an output
    or `resident` (the parameters', the module's inputs'); every other node's value
    allocated when it runs, unless it views a live storage or Inductor fuses it
    (_fused); a pointwise op's output takes the place of an input of its size that dies
    there (Inductor's in-place buffer reuse), as an index_put's or scatter's does
    (_writes_over_first). The nodes run in the graph's order or in
    a least-peak-first order (_least_peak_order), whichever peaks lower: Inductor's
    reorder_for_peak_memory (on by default) takes the lowest of its orders, the graph's
    among them (a backward's mm for an input's gradient before the one for a weight's,
    in graph order, holds both the gradient and the saved input: the residual MLP of
    bench/peak_target.py was predicted 6 MiB over its measured backward). An estimate
    of Inductor's buffers, not a count of them."""
    nodes = list(graph.nodes)
    peak = _walk_peak(graph, nodes, start, resident)
    order = _least_peak_order(graph, start, resident)
    return peak if order is None else min(peak, _walk_peak(graph, order, start, resident))


def _least_peak_order(graph: torch.fx.Graph, start, resident):
    """A topological order of `graph`'s nodes, greedy for the least memory (Inductor's
    topological_sort_lpmf on FX nodes): of the nodes ready, one that keeps the memory
    within the highest so far, the least after it runs, else the least while it runs
    (then the least after it).
    Sizes as _walk_peak counts them (views and fused nodes allocate nothing; a storage
    is freed when its last reader has run). None for a graph too large to reorder
    cheaply."""
    nodes = [n for n in graph.nodes if n.op != "output"]
    if len(nodes) > 4000:
        return None
    out_node = next(iter(graph.find_nodes(op="output")), None)
    outputs: set = set()
    if out_node is not None:
        torch.fx.node.map_arg(out_node.args, outputs.add)
    key, alloc, size = {}, {}, {}  # node -> storage, bytes it allocates; storage -> bytes
    for n in nodes:
        k = key[n] = _storage(n.meta.get("val"))
        first = k is not None and k not in size
        if first:
            size[k] = _storage_nbytes(n.meta.get("val"))
        alloc[n] = size[k] if first and n.op != "placeholder" and not _fused(n, outputs) else 0
    kept = {key[o] for o in outputs if o in key} | set(resident)
    readers: dict = {}  # storage -> readers not run yet
    for n in nodes:
        for k in {key.get(a) for a in n.all_input_nodes} - {None, key[n]}:
            readers[k] = readers.get(k, 0) + 1
    waiting = {n: len(set(n.all_input_nodes)) for n in nodes}
    users = {n: [u for u in n.users if u.op != "output"] for n in nodes}
    ready = [n for n in nodes if waiting[n] == 0]
    index = {n: i for i, n in enumerate(nodes)}
    live = sum(size.get(key[n], 0) for n in start if key.get(n) not in kept)
    high, order = live, []

    def frees(n) -> int:
        ks = {key.get(a) for a in n.all_input_nodes} - {None, key[n]}
        return sum(size.get(k, 0) for k in ks if readers.get(k) == 1 and k not in kept)

    while ready:
        if any(n.op == "placeholder" for n in ready):
            n = min((n for n in ready if n.op == "placeholder"), key=index.get)
        else:
            under = [n for n in ready if live + alloc[n] <= high]
            if under:
                n = min(under, key=lambda n: (live + alloc[n] - frees(n), index[n]))
            else:
                n = min(ready, key=lambda n: (live + alloc[n], alloc[n] - frees(n), index[n]))
        ready.remove(n)
        order.append(n)
        freed = frees(n)
        live += alloc[n]
        high = max(high, live)
        live -= freed
        for k in {key.get(a) for a in n.all_input_nodes} - {None, key[n]}:
            readers[k] -= 1
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if len(order) != len(nodes):
        return None
    return order + ([out_node] if out_node is not None else [])


def _walk_peak(graph: torch.fx.Graph, order, start: Sequence = (), resident=frozenset()) -> int:
    """_live_peak's walk over the nodes in `order` (a topological order of `graph`)."""
    out_node = next(iter(graph.find_nodes(op="output")), None)
    outputs: set = set()
    if out_node is not None:
        torch.fx.node.map_arg(out_node.args, outputs.add)
    start = set(start)
    refs: dict = {}  # storage -> nodes holding it that are not dead yet
    size: dict = {}  # storage -> bytes counted live (0: resident, fused or not counted)
    held: dict = {}  # node -> the storages it holds
    dying: dict = {}  # node -> the nodes whose last reader it is
    last_use = {}
    for n in order:
        for a in n.all_input_nodes:
            last_use[a] = n
    for a, n in last_use.items():
        dying.setdefault(n, []).append(a)
    live = peak = 0

    def hold(node, key, nbytes):
        nonlocal live
        if key not in refs:
            refs[key], size[key] = 0, nbytes
            live += nbytes
        refs[key] += 1
        held.setdefault(node, []).append(key)

    def release(n, inplace=None):
        """Frees what dies at `n`; with `inplace` (bytes), only one storage of that size
        held by a dying input alone: Inductor's kernel writes its output over it."""
        nonlocal live
        for a in dying.get(n, ()):
            if a in outputs or a not in held:
                continue
            keys = held[a]
            if inplace is not None:
                if not (len(keys) == 1 and refs[keys[0]] == 1 and size[keys[0]] == inplace):
                    continue
            for key in held.pop(a):
                refs[key] -= 1
                if refs[key] == 0:
                    live -= size.pop(key)
                    del refs[key]
            if inplace is not None:
                return

    for n in order:
        if n.op == "output":
            break
        val = n.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        for v in vals:
            key = _storage(v)
            if key is None:
                continue
            if n.op == "placeholder":
                counted = n in start and key not in resident
            else:
                counted = not _fused(n, outputs)
            nbytes = _storage_nbytes(v) if counted else 0
            if nbytes and (_pointwise(n) or _writes_over_first(n)):
                release(n, nbytes)
            hold(n, key, nbytes)
        peak = max(peak, live)
        release(n)
    return max(peak, live)


def _storage_nbytes(val) -> int:
    try:
        n = fx._hint(val.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001
        n = None
    return n if n is not None else _nbytes(val)


def _partitioned_saved_bytes(graph: torch.fx.GraphModule, fakes, skip=frozenset()) -> Partition:
    """_partitioned's figures, on a shared joint where it can; where a ladder step's tags
    cannot be put on the shared joint (NoProvenance: Inductor's joint passes left the
    tagged nodes with no provenance; fuzz seed 941051, a fractional activation) on a
    trace of the graph with its tags on, or, inside the compile, on the old way's
    (Retrace)."""
    try:
        return _partitioned(graph, fakes, skip, share=True)
    except NoProvenance as e:
        if _STATE["mode"] == "inside":
            from .partitioner import Retrace

            raise Retrace(str(e)) from e
        return _partitioned(graph, fakes, skip, share=False)


def _partitioned(graph: torch.fx.GraphModule, fakes, skip, share: bool) -> Partition:
    """What Inductor's partitioner keeps for backward on `graph`: AOTAutograd traces the
    joint graph and Inductor's partition_fn (its joint passes, then the min-cut
    rematerialization) splits it; no code is generated. The bytes of the backward
    graph's inputs other than the incoming gradients and the graph inputs whose
    positions are in `skip` (AOTAutograd's `primals_<position + 1>`: parameters, which
    the module keeps anyway), counted as saved_tensors_hooks count them: each storage
    once, at its size, views of the skipped inputs' storages excluded. Inside
    shared_joints() a graph traced before with the same code and the same recompute
    tags is not traced again: its joint, as Inductor's joint passes left it, is
    partitioned again (the partitioner's options are all that differ)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.virtualized import V

    box = {}
    # Shared: the joint traced without a ladder step's tags, put on a copy (_retag); not
    # shared: traced with them on.
    overlay = _ladder_overlay(graph) if share and _sharing() else {}
    with _ladder_base(graph, overlay):
        key = _joint_key(graph, fakes)
        if _STATE["mode"] == "inside" and (key is None or key not in _JOINTS):
            from .partitioner import Retrace

            raise Retrace("a dry run of a graph the compile did not trace")

        def partition(joint, joint_inputs, **kwargs):
            fw, bw = _split(joint, joint_inputs, kwargs, key, graph, overlay)
            box["partition"] = _figures(joint, fw, bw, skip)
            return fw, bw

        # Inductor's joint passes read V.fake_mode (its seed pass for dropout builds
        # FakeTensors with it), which compile_fx installs and a dry run must too.
        # The compile's joint passes, the tags' too (_keyed_by_tags), so the dry run
        # partitions what the compile will.
        with (
            V.set_fake_mode(detect_fake_mode(fakes)),
            _keyed_by_tags(graph),
            _forget_fx_sources(graph),
        ):
            if key is not None and key in _JOINTS:
                joint, joint_inputs, kwargs = _JOINTS[key]
                with _fake_mode_found(detect_fake_mode(fakes)):
                    partition(_copy(joint), joint_inputs, **kwargs)
            else:
                aot_module_simplified(
                    graph,
                    fakes,
                    fw_compiler=lambda g, _: g,
                    bw_compiler=lambda g, _: g,
                    partition_fn=partition,
                    decompositions=select_decomp_table(),
                )
    return box.get("partition", Partition.of(0))


def _fake_mode_found(mode):
    """A tracing context holding `mode` where none is: a shared joint's copy is split
    outside AOTAutograd's trace, and torch's functionalize_rng_ops (a recomputed random op)
    looks the fake mode up (fuzz seed 941071: "fake_mode must not be None" beside a
    coupling chain, where no Dynamo context is either)."""
    if mode is None or torch._guards.TracingContext.try_get() is not None:
        return contextlib.nullcontext()
    return torch._guards.tracing(torch._guards.TracingContext(mode))


def _ladder_overlay(graph: torch.fx.GraphModule) -> dict:
    """The recompute tags a ladder step put on `graph` (LADDER_TAGGED): node name ->
    its tags now."""
    return {n.name: tags_of(n) for n in graph.graph.nodes if LADDER_TAGGED in n.meta}


@contextlib.contextmanager
def _ladder_base(graph: torch.fx.GraphModule, overlay: dict):
    """`graph` with the ladder step's tags in `overlay` off (the tags each node had
    before, LADDER_TAGGED's value) while it is keyed and traced, then on again: every
    ladder step shares the one joint of the graph without them (_retag), the dry runs'
    and the compile's under budget.partitioner's planner."""
    nodes = [n for n in graph.graph.nodes if n.name in overlay]
    for n in nodes:
        set_tags(n, n.meta[LADDER_TAGGED])
    try:
        yield
    finally:
        for n in nodes:
            set_tags(n, overlay[n.name])


def _retag(joint: torch.fx.GraphModule, graph: torch.fx.GraphModule, overlay: dict) -> int:
    """The ladder step's tags (`overlay`, _ladder_overlay) put on a joint of `graph`
    traced without them, after Inductor's joint passes: each forward node that `graph`'s
    node made (its "from_node" provenance, which AOTAutograd's trace and the joint
    passes record) takes that node's tags, as a trace with the tags on gives them. The
    same figures as a trace with the tags on at every step tried (2026-11-30: TinyDecoder
    and resnet18, 5 steps each, bytes equal), at a fraction of the time: a dry run is
    a min-cut, not a trace and the joint passes again. Returns how many nodes it tagged."""
    if not overlay:
        return 0
    gid, done = id(graph.graph), 0
    for n in joint.graph.nodes:
        if n.op != "call_function":
            continue  # (a graph input is never recomputed: _untag_placeholders)
        stack = list(n.meta.get("from_node") or ())
        while stack:
            src = stack.pop()
            if getattr(src, "graph_id", None) == gid:
                if src.name in overlay:
                    set_tags(n, overlay[src.name])
                    done += 1
                break
            stack.extend(getattr(src, "from_node", None) or ())
    return done


# The planner's state while it runs inside the compile (budget.partitioner): "mode" None,
# "replay" (a plan from the plan cache or NeedsPlanning) or "inside" (dry runs of the
# compile's joint only); "uuid", the partitioner key a plan made inside is compiled under
# (stored with it); "replayed_uuid", that of the plan replayed last.
_STATE = {"mode": None, "uuid": None, "replayed_uuid": None}


# shared_joints()'s joints: key (_joint_key) -> (the joint after Inductor's joint passes,
# its inputs, the partitioner's arguments); None outside shared_joints().
_JOINTS: Optional[dict] = None


@contextlib.contextmanager
def shared_joints():
    """Dry runs inside share AOTAutograd's joint graph: a graph partitioned again with
    the same code and recompute tags (the unmodified graph under the default options,
    FUSED_RECOMPUTE's and torch's knapsack: only the partitioner's options differ) is
    split from a copy of the joint its first dry run traced, Inductor's joint passes
    run, without tracing it again (TinyDecoder, depth 4: of a dry run's ~5.7 s, 2.4 s
    were the trace and 1.4 s the joint passes). The joints are dropped on leaving."""
    global _JOINTS
    outer = _JOINTS
    _JOINTS = {} if outer is None else outer
    try:
        yield
    finally:
        _JOINTS = outer


def _joint_key(graph: torch.fx.GraphModule, fakes):
    """What a joint is shared by: the graph, its code, its recompute tags, its inputs
    (None: not shared, outside shared_joints() or where the partitioner is the user's)."""
    if not _sharing():
        return None
    from ..cache_keys import _region_digest

    # The graph's code as text: GraphModule.code would compile a lazy module's source,
    # which FX then keeps for the process's life (test_compile_budget counts them).
    code = graph.graph.python_code(root_module="self").src
    return (id(graph), code, _region_digest(graph), tuple(id(f) for f in fakes))


def _sharing() -> bool:
    """Whether dry runs share joints: inside shared_joints(), under Inductor's partitioner
    or memslim's own (budget.partitioner), not a user's, where partition_fn takes an
    override."""
    from torch._inductor import config

    user = config.custom_partitioner_fn
    return (
        _JOINTS is not None and (user is None or getattr(user, "memslim", False)) and _overridable()
    )


@functools.lru_cache(None)
def _overridable() -> bool:
    """Whether Inductor's partition_fn takes partitioner_fn_override (torch 2.14 does)."""
    import inspect

    from torch._inductor.compile_fx import partition_fn

    return "partitioner_fn_override" in inspect.signature(partition_fn).parameters


def _split(joint, joint_inputs, kwargs, key, graph, overlay):
    """Inductor's partition_fn on `joint`; with a key, the joint as its joint passes
    leave it is kept for shared_joints() first (the min-cut changes the graph it splits),
    and `graph`'s ladder tags (`overlay`) put on what is split (_retag)."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.compile_fx import partition_fn

    def min_cut(gm, inputs, **kw):
        return min_cut_rematerialization_partition(gm, inputs, compiler="inductor", **kw)

    if key is None:
        return partition_fn(joint, joint_inputs, **kwargs)
    if key in _JOINTS:  # a copy of a shared joint: its joint passes have run
        _retag_or_raise(joint, graph, overlay)
        return min_cut(joint, joint_inputs, **kwargs)

    def kept(gm, inputs, **kw):
        _JOINTS[key] = (_copy(gm), inputs, kw)
        _retag_or_raise(gm, graph, overlay)
        return min_cut(gm, inputs, **kw)

    return partition_fn(joint, joint_inputs, partitioner_fn_override=kept, **kwargs)


class NoProvenance(RuntimeError):
    """A ladder step's tags found no node of the joint to go on (_retag_or_raise)."""


def _retag_or_raise(joint, graph, overlay) -> None:
    if overlay and not _retag(joint, graph, overlay):
        # (no joint node came from a tagged one: a torch whose trace records no
        # provenance, or joint passes that dropped it; a dry run that measured the graph
        # untagged would mislead the planner)
        raise NoProvenance(
            "memslim: a dry run could not put the ladder's recompute tags on the joint "
            "graph (no node provenance)"
        )


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A joint to split again: its nodes copied (their metadata, fake values included,
    shared), its attributes and metadata the original's."""
    import copy

    out = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    out.meta.update(gm.meta)
    return out


def _figures(joint, fw, bw, skip) -> Partition:
    """A partition's figures (see _partitioned_saved_bytes and Partition)."""
    skipped = {f"primals_{i + 1}" for i in skip}
    params = {
        _storage(n.meta.get("val"))
        for n in joint.graph.find_nodes(op="placeholder")
        if n.name in skipped
    } - {None}
    bw_inputs = list(bw.graph.find_nodes(op="placeholder"))
    saved = _distinct_storage_bytes(
        [n.meta.get("val") for n in bw_inputs if not n.name.startswith("tangents")],
        params,
    )
    return Partition.of(saved, _profile(fw, bw, bw_inputs, params, skip))


def _profile(fw, bw, bw_inputs, params, skip) -> dict:
    """Partition's figures for the step-peak predictor (see Partition)."""
    saved_names = {n.name for n in bw_inputs}
    (fw_out,) = fw.graph.find_nodes(op="output")
    fw_vals = fw_out.args[0] if isinstance(fw_out.args[0], (list, tuple)) else [fw_out.args[0]]
    outputs = _distinct_storage_bytes(
        [
            a.meta.get("val")
            for a in fw_vals
            if isinstance(a, torch.fx.Node) and a.name not in saved_names
        ],
        params,
    )
    (bw_out,) = bw.graph.find_nodes(op="output")
    grads_out = bw_out.args[0] if isinstance(bw_out.args[0], (list, tuple)) else [bw_out.args[0]]
    grads = _distinct_storage_bytes(
        [
            a.meta.get("val")
            for i, a in enumerate(grads_out)
            if i in skip and isinstance(a, torch.fx.Node)
        ]
    )
    return {
        "fw_peak": _live_peak(fw.graph, resident=params),
        "bw_peak": _live_peak(bw.graph, start=bw_inputs, resident=params),
        "outputs": outputs,
        "grads": grads,
        "flops": _graph_flops(fw.graph) + _graph_flops(bw.graph),
    }


def _graph_flops(graph: torch.fx.Graph) -> int:
    """The floating-point operations of `graph`'s nodes that torch's flop counter has a
    formula for (torch.utils.flop_counter.flop_registry: matrix products, convolutions,
    attention), from the nodes' fake values, symbolic sizes at their hints: what torch's
    knapsack estimates a re-run's time by (its "flops" runtime estimator), counted over a
    whole partition."""
    from torch.utils.flop_counter import flop_registry

    def val(a):
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    total = 0
    for n in graph.nodes:
        formula = flop_registry.get(getattr(n.target, "overloadpacket", None))
        if n.op != "call_function" or formula is None:
            continue
        args, kwargs = torch.fx.node.map_aggregate((n.args, n.kwargs), val)
        try:
            count = formula(*args, **kwargs, out_val=n.meta.get("val"))
        except Exception:  # noqa: BLE001  (a formula that cannot read these values: uncounted)
            continue
        total += fx._hint(count) or 0
    return total


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
