"""memslim's FX front end: the same decisions over aten-level FX graphs.

What: `optimize(program, example_inputs=None, **policy)` takes a
torch.export ExportedProgram or an aten-level torch.fx.GraphModule (what
make_fx or torch.compile's backend sees), hands its nodes to the C++ decision
core (passes/core/: the saved-tensor rules, prices and decisions the
TorchScript passes use, behind the FX safety gate), and rewrites the chosen
nodes to memslim ops with the same arguments. Shapes come from each node's
`meta["val"]` (FakeTensors); with `example_inputs` and no `meta["val"]`, a
FakeTensorProp run fills them in. Nothing is recorded or run for real.
Why here: only reading the graph and applying a rewrite are per front end;
what to rewrite is decided once, in C++ (passes/fx/fx_front_end.cpp).
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, List, Optional, Tuple

import torch
import torch.fx

from . import _C
from .cache_keys import LADDER_TAGGED, set_tags, tags_of
from ._policy import policy_keywords
from . import records
from .records import Decision


def _hint(x) -> Optional[int]:
    """An int, or a SymInt's size hint (what the shape is for this trace); None if none."""
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        hint = x.node.hint
        return int(hint) if hint is not None else None
    return None


def _static_tensor(val) -> bool:
    """Whether `val` is a tensor whose sizes and strides are all ints (no symbol)."""
    return isinstance(val, torch.Tensor) and all(
        isinstance(d, int) for d in (*val.shape, *val.stride())
    )


def _contiguous(val) -> Optional[bool]:
    try:
        return bool(val.is_contiguous())
    except Exception:  # a symbolic layout torch cannot decide
        return None


# c10::ScalarType codes of the dtypes autocast takes, for the core's reading of an
# _enter_autocast marker (passes/core/loss_head.cpp, under_autocast).
_SCALAR_CODES = {torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}


class _Serializer:
    """The FX graph as the core reads it, `self.graph` (a _C.FxGraph, built once and
    read by every _C.fx_run of the graph: passes/include/memslim/fx/fx_graph_view.h; one
    prim::Param node for the placeholders, a prim::GetAttr node per get_attr where it
    stands, a prim::ListConstruct per list argument, one prim::Return), with the fx node
    of each of its nodes (`fx_nodes`), the value ids of each fx node (`outs`) and the
    constant arguments by value id (`constants`)."""

    def __init__(
        self, graph: torch.fx.Graph, leaf_grad: Optional[dict] = None, state: Iterable[str] = ()
    ):
        """leaf_grad: placeholder name -> whether it requires grad, where known (a
        buffer: False; torch.compile's inputs: their flag). state: the placeholders that
        are the module's parameters and buffers (kept by the module, so keeping them
        costs autograd nothing)."""
        self.graph = _C.FxGraph()
        self.constants: dict = {}  # value id -> the constant argument
        self.fx_nodes: List[Optional[torch.fx.Node]] = []  # per record in self.nodes
        self.outs: dict = {}  # fx node -> [value ids]
        self._no_grad = False  # inside torch._C._set_grad_enabled(False) ... (True)
        leaf_grad = leaf_grad or {}
        state = set(state)
        params = [n for n in graph.nodes if n.op == "placeholder"]
        ids = []
        for n in params:
            ids.append(
                self._tensor_value(
                    n.name, n.meta.get("val"), leaf_grad.get(n.name), n.name in state
                )
            )
            self.outs[n] = [ids[-1]]
        self._node("prim::Param", None, [], ids, None)
        for n in graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "get_attr":  # where it is: an op reading it goes after it
                self.outs[n] = [
                    self._tensor_value(n.name, n.meta.get("val"), leaf_grad.get(n.name))
                ]
                self._node("prim::GetAttr", None, [], self.outs[n], n)
            elif n.op == "output":
                self._node("prim::Return", None, self._flat_inputs(n.args), [], n)
            elif (
                n.op == "call_function"
                and n.target is operator.getitem
                and isinstance(n.args[0], torch.fx.Node)
                and len(self.outs.get(n.args[0], [])) > 1
            ):
                src, i = n.args
                self.outs[n] = [self.outs[src][i]] if isinstance(i, int) else []
            elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
                self._op(n)
            elif n.op in ("call_module", "call_method"):
                raise ValueError(
                    f"memslim.fx: node '{n.name}' is a {n.op} ({n.target}): memslim.fx reads "
                    "aten-level graphs (torch.export.export(...), make_fx, or torch.compile("
                    "backend='memslim')), not torch.fx.symbolic_trace's"
                )
            else:
                name = getattr(n.target, "__qualname__", None) or str(n.target)
                outs = self._outputs_of(n)
                inputs = self._flat_inputs((n.args, n.kwargs))
                if name == "_enter_autocast":  # its constants: device, dtype (c10's code), enabled
                    inputs = [
                        self._input(_SCALAR_CODES.get(a) if isinstance(a, torch.dtype) else a)
                        for a in n.args
                    ]
                self._node("python::" + name, None, inputs, outs, n)
                if n.target is torch._C._set_grad_enabled and n.args:
                    self._no_grad = not n.args[0]

    def _tensor_value(
        self, name: str, val, requires_grad: Optional[bool] = None, state: bool = False
    ) -> int:
        if self._no_grad:  # made under no_grad: autograd records nothing for it
            requires_grad = False
        if not isinstance(val, torch.Tensor):
            return self.graph.add_opaque(name)
        sizes = [_hint(d) for d in val.shape]
        return self.graph.add_tensor(
            name,
            numel=_hint(val.numel()),
            dtype=val.dtype,
            device=val.device.type,
            requires_grad=requires_grad,
            state=state,
            rank=val.dim(),
            contiguous=_contiguous(val),
            sizes=None if None in sizes else sizes,
        )

    def _constant(self, obj) -> int:
        v = self.graph.add_constant(repr(obj)[:40], obj)
        self.constants[v] = obj
        return v

    def _node(self, kind, overload, inputs, outputs, fx_node):
        self.graph.add_node(kind, overload, inputs, outputs)
        self.fx_nodes.append(fx_node)

    def _input(self, a) -> int:
        if isinstance(a, torch.fx.Node):
            outs = self.outs.get(a)
            if not outs:  # a node with no values (a tuple nobody unpacked): opaque
                outs = self.outs[a] = [self._tensor_value(a.name, None)]
            return outs[0]
        if isinstance(a, (list, tuple)) and any(isinstance(e, torch.fx.Node) for e in a):
            elems = [self._input(e) for e in a]
            out = self._tensor_value("list", None)
            self._node("prim::ListConstruct", None, elems, [out], None)
            return out
        return self._constant(a)

    def _flat_inputs(self, args) -> List[int]:
        flat = []
        torch.fx.node.map_arg(args, lambda n: flat.append(self._input(n)))
        return flat

    def _outputs_of(self, n: torch.fx.Node) -> List[int]:
        val = n.meta.get("val")
        if isinstance(val, (list, tuple)):
            ids = [self._tensor_value(f"{n.name}[{i}]", v) for i, v in enumerate(val)]
        else:
            ids = [self._tensor_value(n.name, val)]
        self.outs[n] = ids
        return ids

    def _op(self, n: torch.fx.Node) -> None:
        schema = n.target._schema
        inputs = []
        for i, arg in enumerate(schema.arguments):
            if i < len(n.args) and not arg.kwarg_only:
                a = n.args[i]
            elif arg.name in n.kwargs:
                a = n.kwargs[arg.name]
            elif arg.has_default_value():
                a = arg.default_value
            else:
                a = None
            inputs.append(self._input(a))
        outs = self._outputs_of(n)
        self._node(schema.name, schema.overload_name, inputs, outs, n)


def _graph_of(program) -> Tuple[torch.fx.GraphModule, bool]:
    if isinstance(program, torch.export.ExportedProgram):
        return program.graph_module, True
    if isinstance(program, torch.fx.GraphModule):
        return program, False
    raise TypeError(
        "memslim.fx.optimize: expected a torch.export.ExportedProgram or an aten-level "
        f"torch.fx.GraphModule, got {type(program).__name__}"
    )


@policy_keywords("memslim.fx.optimize")
def optimize(
    program,
    example_inputs: Optional[Iterable[Any]] = None,
    *,
    passes: Optional[Iterable[str]] = None,
    peak_memory=None,
    policy: dict,
):
    """Rewrites `program` (an ExportedProgram or an aten-level GraphModule) in place
    and returns it; `memslim.report(program)` gives the decision records.

    example_inputs: only for a GraphModule whose nodes have no `meta["val"]`
    (FakeTensorProp fills it in from them). passes: pass flags (default: the FX
    front end's: functionalize, canonicalize, fuse-activation-dropout,
    recompute-pointwise-regions, output-saving).
    Policy keywords as every entry point's (below); dropout_mask_bytes None means 0 here
    (eager autograd keeps dropout's float noise); the coupling options have no effect
    (couplings run under memslim.compile and memslim.optimize). memory_budget: refused here (ValueError): a budget
    needs memslim.compile, whose planner applies blocks as Inductor's recompute tags;
    peak_memory likewise (a step's peak is planned by memslim.compile or measured by
    memslim.optimize, which run the step).
    The rewritten ExportedProgram's `.module()` trains like the original; each
    rewritten node calls torch.ops.memslim.<op> with the aten op's arguments, and each
    recompute region is one torch.ops.memslim.recompute_region node (its inputs, the
    region's graph text) whose getitems replace the region's outputs.
    """
    if peak_memory is not None:
        raise ValueError(
            "memslim.fx.optimize: peak_memory needs a training step to plan and measure, "
            "which an exported program does not run here; use memslim.compile(model, "
            "peak_memory=...) or memslim.optimize(model, example_inputs, peak_memory=...)"
        )
    gm, exported = _graph_of(program)
    if example_inputs is not None and not exported:
        if any(n.op != "output" and "val" not in n.meta for n in gm.graph.nodes):
            from torch._subclasses.fake_tensor import FakeTensorMode
            from torch.fx.passes.fake_tensor_prop import FakeTensorProp

            # Constants the graph holds (make_fx's _param_constant*) are real.
            FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(
                *example_inputs
            )
    decisions, apply, _, _ = _plan(
        gm, passes, policy, leaf_grad=_leaf_grad(program), state=_module_state(program)
    )
    renamed = apply()
    if exported and renamed:
        # A region output that was a program output (or a buffer's new value) is now a
        # getitem of the op: the signature names it (torch.export.save validates it).
        for spec in program.graph_signature.output_specs:
            name = getattr(spec.arg, "name", None)
            if name in renamed:
                spec.arg.name = renamed[name]
    records.remember(program, decisions, "memslim.fx.optimize")
    return program


def _leaf_grad(program) -> dict:
    """Placeholders known not to require grad: an ExportedProgram's buffers and
    constants (its parameters and user inputs: unknown, may)."""
    if not isinstance(program, torch.export.ExportedProgram):
        return {}
    from torch.export.graph_signature import InputKind

    return {
        spec.arg.name: False
        for spec in program.graph_signature.input_specs
        if spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR) and hasattr(spec.arg, "name")
    }


def _module_state(program) -> set:
    """An ExportedProgram's placeholders that are its parameters, buffers and constant
    tensors: the module keeps them, whoever else does."""
    if not isinstance(program, torch.export.ExportedProgram):
        return set()
    from torch.export.graph_signature import InputKind

    return {
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
        and hasattr(spec.arg, "name")
    }


def _plan(
    gm: torch.fx.GraphModule,
    passes: Optional[Iterable[str]],
    policy: dict,
    *,
    leaf_grad: Optional[dict] = None,
    state: Iterable[str] = (),
    regions: str = "op",
    serial: Optional[_Serializer] = None,
    ladders: str = "both",
):
    """The decisions on `gm` (its nodes need `meta["val"]`) and a function that applies
    them; `gm` is left as it is until that function is called (memslim's torch.compile
    backend partitions the graph in between). leaf_grad: placeholder name -> whether it
    requires grad, where known. regions: how a recompute region is applied: "op" (one
    memslim::recompute_region node keeping the region's inputs: eager autograd runs the
    graph) or "tags" (the region's nodes tagged MUST_RECOMPUTE for Inductor's partitioner,
    which would inline the op's backward and save the region's values again). serial:
    `gm`'s _Serializer when the caller already made one (one per graph per compile).
    ladders: which of the budget's ladders to build ("both", "op": the whole blocks',
    "tags": the pieces', "none"); the others come back None."""
    if regions not in ("op", "tags"):
        raise ValueError(f"memslim.fx: regions must be 'op' or 'tags', got {regions!r}")
    if policy.get("memory_budget") is not None and regions != "tags":
        raise ValueError(
            "memory_budget: torch.export / .pt2 programs have no budget planner "
            "(it recomputes whole blocks through Inductor's partitioner); use "
            "memslim.compile(model, memory_budget=B), or memslim.optimize / "
            "memslim-opt on a TorchScript graph"
        )
    pass_list = list(passes) if passes is not None else None  # None: the default pipeline
    if pass_list is not None and "invertible-couplings" in pass_list:
        raise ValueError(
            "memslim.fx.optimize: invertible-couplings runs under memslim.compile "
            "only (a torch.export program has no op that carries F and G as FX "
            "graphs); use memslim.compile(model) or memslim.optimize"
        )
    s = serial or _Serializer(gm.graph, leaf_grad, state)
    try:
        run = _C.fx_run(s.graph, pass_list, policy, ladders)
    except ValueError as e:
        raise ValueError(f"memslim.fx.optimize: {e}") from None
    rewrites = run.rewrites
    # Region ops of this plan (tags mode: they have no node) -> the fx nodes they cover.
    region_members = {}
    blocks = None if run.ladder is None else BlockLadder(gm, s, run.ladder, region_members)
    parts = None if run.pieces is None else BlockLadder(gm, s, run.pieces, region_members)

    apply = _Application(gm, s, rewrites, regions, region_members)
    return [Decision(r) for r in run.records], apply, blocks, parts


class _Application:
    """The plan's rewrites applied to the FX graph, when called (memslim's torch.compile
    backend partitions the graph before and after): every new target and argument is
    built first (nothing changes if one cannot be), then the graph is edited. Returns
    {old node name: new node name} for the values a region op's outputs replaced."""

    def __init__(self, gm, s, rewrites, regions: str, region_members: dict):
        self.gm, self.s, self.rewrites, self.regions = gm, s, rewrites, regions
        self.region_members = region_members  # filled in: region op index -> fx nodes

    def __call__(self) -> dict:
        gm, s = self.gm, self.s
        _repair_users(gm.graph)
        # Which fx node (or getitem of one) carries each value id.
        self.carrier = {}
        for node, ids in s.outs.items():
            if len(ids) == 1:
                self.carrier.setdefault(ids[0], node)
        # Outputs of the region ops this plan adds: a later rewrite may read one (a
        # residual join whose residual a region computes); its node exists once the
        # region is applied, so the argument is resolved then.
        self.region_new = {
            v for r in self.rewrites if r.region is not None for v in r.region.new_outputs
        }
        plan = self._plan()
        renamed = self._carry_out(plan)
        if self.rewrites:
            gm.recompile()
        return renamed

    def value(self, v):
        if v in self.carrier:
            return self.carrier[v]
        if v in self.region_new:
            return _RegionOutput(v)
        if v in self.s.constants:  # a constant argument of the original node
            return self.s.constants[v]
        raise ValueError(f"memslim.fx.optimize: internal error: value {v} has no node")

    def _plan(self) -> list:
        """(node or region op index, target, new (args, kwargs) or None, erased nodes,
        region or None) per rewrite, in order."""
        s, carrier = self.s, self.carrier
        plan = []
        created = set()  # node indices of the region ops this plan adds
        position = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        for rw in self.rewrites:
            index, region = rw.node, rw.region
            ns, name = rw.kind.split("::")
            target = getattr(getattr(getattr(torch.ops, ns), name), rw.overload or "default")
            if region is not None:
                nodes, inputs, before = region.nodes, region.inputs, region.before
                if any(i >= len(s.fx_nodes) or s.fx_nodes[i] is None for i in nodes) or not (
                    before in created or (before < len(s.fx_nodes) and s.fx_nodes[before])
                ):
                    raise ValueError(
                        "memslim.fx.optimize: internal error: a region's nodes are not the graph's"
                    )
                # Never a program that reads a value before it is made.
                anchor = s.fx_nodes[before] if before < len(s.fx_nodes) else None
                late = [
                    carrier[v]
                    for v in inputs
                    if v in carrier
                    and anchor is not None
                    and position.get(carrier[v], -1) >= position[anchor]
                ]
                if self.regions == "op" and late:
                    raise ValueError(
                        "memslim.fx.optimize: internal error: a region op would "
                        f"read {late[0].name} before it is made"
                    )
                created.add(index)
                plan.append((index, target, None, [], region))
                continue
            new_args = None
            if rw.args is not None:  # by the new op's schema: keyword-only ones as kwargs
                values = [a.constant if a.value is None else self.value(a.value) for a in rw.args]
                params = target._schema.arguments
                new_args = (
                    tuple(v for v, a in zip(values, params) if not a.kwarg_only),
                    {a.name: v for v, a in zip(values, params) if a.kwarg_only},
                )
            plan.append(
                (s.fx_nodes[index], target, new_args, [s.fx_nodes[i] for i in rw.erased], None)
            )
        return plan

    def _carry_out(self, plan) -> dict:
        gm, s, carrier = self.gm, self.s, self.carrier
        ops = {}  # region op node index -> its fx node
        renamed = {}
        tag_ids = _checkpoint_ids(gm, s, [r[4] for r in plan if r[4] is not None])
        for node, target, new_args, erased, region in plan:
            if region is not None:
                self.region_members[node] = [s.fx_nodes[i] for i in region.nodes]
                ops[node] = _apply_region(
                    gm,
                    s,
                    region,
                    target,
                    carrier,
                    self.value,
                    ops,
                    self.regions,
                    tag_ids.get(id(region)),
                    renamed,
                )
                continue
            node.target = target
            if new_args is not None:
                node.args, node.kwargs = torch.fx.node.map_aggregate(
                    new_args, lambda a: carrier[a.v] if isinstance(a, _RegionOutput) else a
                )
            for dead in erased:  # the C++ view erased them; a node still read stays
                if not dead.users:
                    gm.graph.erase_node(dead)
        return renamed


def coupling_chains(
    gm: torch.fx.GraphModule,
    policy: dict,
    *,
    leaf_grad: Optional[dict] = None,
    state: Iterable[str] = (),
    serial: Optional[_Serializer] = None,
):
    """invertible-couplings over `gm` (its nodes need `meta["val"]`): its decision records
    and, per chain it would rewrite, the fx nodes the chain covers (program order) with
    the bytes they keep today and the chain's two outputs. Nothing is rewritten: the FX
    graph has no op carrying F and G, so memslim's torch.compile backend runs each chain
    as a piece of its own (chains._compile_with_chains)."""
    s = serial or _Serializer(gm.graph, leaf_grad, state)
    # No ladder: the search reads none (under a budget each is a greedy walk whose
    # cost rises with the cube of the graph: TinyDecoder, 16 blocks, 3.4 s against 0.01).
    run = _C.fx_run(s.graph, ["invertible-couplings"], policy, "none")
    found = []
    for chain in run.chains:
        covers, before, after = chain.covers, chain.kept_before, chain.kept_after
        if any(i >= len(s.fx_nodes) for i in covers):
            raise ValueError("memslim.fx: internal error: a chain's nodes are not the graph's")
        # None: a record the serializer made (a list argument's prim::ListConstruct).
        found.append(([s.fx_nodes[i] for i in covers if s.fx_nodes[i] is not None], before, after))
    return [Decision(r) for r in run.records], found


class BlockLadder:
    """The memory budget's block ladder (core/recompute_blocks.h) over a graph the backend
    applies as recompute tags: `steps[k]`, a _C.FxLadderStep (kept and peak: predicted
    bytes; flops: added forward work; move; runs: lists of view node ids; light: it
    re-runs no convolution or matrix product); step 0 recomputes nothing, and the steps do not depend on the budget. `tag(k)` marks step
    k's runs on the graph (after the plan's apply()): each run's nodes MUST_RECOMPUTE
    under one checkpoint id of its own, so that Inductor's partitioner keeps the run's
    input and the state it reads (and the boundary between two runs) and re-runs the
    run in backward, as torch.utils.checkpoint would; a recompute region inside a run
    takes the run's id. A run overlapping the user's own checkpointing is left out (the
    user decides there). `tag(0)` takes memslim's block tags off again."""

    def __init__(self, gm, s, ladder, region_members):
        self.why, self.segments = ladder.why, ladder.segments
        self.refused, self.steps = ladder.refused, ladder.steps  # [_C.FxLadderStep]
        self._gm, self._s, self._regions = gm, s, region_members
        # What carried a recompute tag before memslim: the user's checkpointing.
        self._user = {n for n in gm.graph.nodes if "recompute" in n.meta}
        self._saved = {}  # node -> its recompute meta before tag()
        self.skipped = 0  # runs of the last tag() left to the user's checkpointing

    def _nodes(self, ids):
        out = []
        for i in ids:
            if i in self._regions:
                out.extend(self._regions[i])
            elif i < len(self._s.fx_nodes) and self._s.fx_nodes[i] is not None:
                out.append(self._s.fx_nodes[i])
            # else: a node only the C++ view has (a region op's input list)
        return out

    def tag(self, k: int) -> None:
        from torch.utils.checkpoint import CheckpointPolicy

        for n, meta in self._saved.items():
            n.meta.pop(LADDER_TAGGED, None)
            set_tags(n, meta)
        self._saved = {}
        self.skipped = 0
        runs = [self._nodes(ids) for ids in self.steps[k].runs]
        start = _next_checkpoint_id(self._gm)
        for nodes in runs:
            if any(n in self._user for n in nodes):
                self.skipped += 1
                continue
            for n in nodes:
                self._saved[n] = tags_of(n)
                n.meta[LADDER_TAGGED] = self._saved[n]  # (budget.measure retags joints by it)
                n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
                n.meta["ac_graph_id"] = start
            start += 1


def _repair_users(graph: torch.fx.Graph) -> None:
    """Makes every node a user of each node it reads. torch.export's graph around a
    no_grad block (wrap_with_set_grad_enabled) can list a value's users without a reader
    outside the block (long-fuzz seed 401084: sigmoid read by mul and by the block, its
    users only the block), and then setting the reader's args raises inside torch.fx."""
    for node in graph.nodes:
        for inp in node.all_input_nodes:
            if node not in inp.users:
                inp.users[node] = None


def _next_checkpoint_id(gm) -> int:
    """One above every checkpoint id already in the graph (the user's, memslim's regions)."""
    return (
        max(
            [
                n.meta.get("ac_graph_id", 0)
                for n in gm.graph.nodes
                if isinstance(n.meta.get("ac_graph_id", 0), int)
            ]
            + [0]
        )
        + 1
    )


def _checkpoint_ids(gm, s, regions) -> dict:
    """Checkpoint ids for tagged regions (id(region) -> id): above every id already in
    the graph (a user's torch.utils.checkpoint regions), in an order where a region
    reading another's output has the larger id, so the partitioner saves the value at
    their boundary (its cleanup_recompute_tags), as the region op would keep it."""
    start = _next_checkpoint_id(gm)
    owner = {}
    for k, r in enumerate(regions):
        for i in r.nodes:
            owner[s.fx_nodes[i]] = k
    deps = {k: set() for k in range(len(regions))}
    for k, r in enumerate(regions):
        for i in r.nodes:
            for a in s.fx_nodes[i].all_input_nodes:
                if owner.get(a, k) != k:
                    deps[k].add(owner[a])
    order, done = [], set()

    def visit(k, path=()):
        if k in done or k in path:  # a cycle cannot be placed; guarded anyway
            return
        for d in sorted(deps[k]):
            visit(d, path + (k,))
        done.add(k)
        order.append(k)

    for k in range(len(regions)):
        visit(k)
    return {id(regions[k]): start + n for n, k in enumerate(order)}


class _RegionOutput:
    """An argument that is a region op's output, resolved once that op is built."""

    __slots__ = ("v",)

    def __init__(self, v: int):
        self.v = v


def _apply_region(gm, s, region, target, carrier, value, ops, mode, tag_id, renamed):
    """One recompute region on the fx graph. "op": memslim::recompute_region(inputs,
    text) just before the decided node, getitems in place of the region's outputs for
    every reader outside it (`renamed` gets old name -> getitem name), the region's
    nodes gone. "tags": the region's nodes marked MUST_RECOMPUTE with checkpoint id
    `tag_id`, unless one already carries a recompute tag (the user's own checkpointing
    decides there). Returns the op's node, or None."""
    nodes, inputs, outputs, new_outputs = (
        region.nodes,
        region.inputs,
        region.outputs,
        region.new_outputs,
    )
    before, text = region.before, region.ir
    members = [s.fx_nodes[i] for i in nodes]
    if mode == "tags":
        from torch.utils.checkpoint import CheckpointPolicy

        if not any("recompute" in n.meta for n in members):
            for n in members:
                n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
                n.meta["ac_graph_id"] = tag_id
        for old, new in zip(outputs, new_outputs):
            carrier[new] = carrier[old]
        return None
    anchor = ops[before] if before in ops else s.fx_nodes[before]
    if anchor is None:  # a region op not built in tags mode: cannot happen in op mode
        raise ValueError("memslim.fx.optimize: internal error: no node to place a region at")
    with gm.graph.inserting_before(anchor):
        op = gm.graph.call_function(target, ([value(v) for v in inputs], text))
        gets = [gm.graph.call_function(operator.getitem, (op, k)) for k in range(len(outputs))]
    inside = set(members)
    for old, new, get in zip(outputs, new_outputs, gets):
        fx_old = carrier[old]
        for key in ("val", "tensor_meta", "stack_trace", "nn_module_stack"):
            if key in fx_old.meta:
                get.meta[key] = fx_old.meta[key]
        fx_old.replace_all_uses_with(get, delete_user_cb=lambda user: user not in inside)
        renamed[fx_old.name] = get.name
        carrier[new] = get
    op.meta["val"] = [g.meta.get("val") for g in gets]
    for key in ("stack_trace", "nn_module_stack"):
        if key in members[-1].meta:
            op.meta[key] = members[-1].meta[key]
    for dead in reversed(members):
        if not dead.users:
            gm.graph.erase_node(dead)
    return op


# memslim.fx.report(program): the one store's report (python/memslim/records.py).
report = records.report
