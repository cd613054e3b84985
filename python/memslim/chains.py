"""Coupling chains under torch.compile: the graph split around them.

What: _compile_with_chains, the backend's way with coupling chains (fx.coupling_chains
found them on the aten graph): split_module splits the graph around the chains
(_chain_levels: which piece each node runs in, in program order), each chain a
_ChainPiece that traces its aten piece at its first call per input signature and hands
the trace to memslim.optimize's pipeline (whose invertible-couplings pass builds
memslim::coupling_chain), every other piece compiled by the backend as a graph of its own
(_Compiled); eager autograd links the pieces. Under a memory budget the chains keep their
outputs and the other pieces share the rest of the target (budget.piece_shares).
Why its own module: no FX op carries F and G as graphs and AOTAutograd would trace through
coupling_chain's backward, so chains are the one decision applied by splitting the graph;
the backend only asks for it where a graph has chains.
"""

from __future__ import annotations

import operator
import os
import re
import warnings
from typing import Callable, List, Optional

import torch

from .budget import BudgetError, budget_note, piece_shares, target_bytes
from .budget.measure import _dynamic_output_shapes, _partitioned_saved_bytes
from . import fx
from . import records as records_store
from .records import Decision


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
        self,
        gm: torch.fx.GraphModule,
        policy: dict,
        records: List[Decision],
        strict: bool = False,
        log: Optional[List[Decision]] = None,
    ):
        super().__init__()
        self.gm = gm
        self.policy = policy
        self.records = records
        self.strict = strict
        self.log = log  # the backend's log of every graph's records (compiled_decisions)
        self.by_signature = {}
        # What Inductor's partitioner keeps for backward on this piece unmodified (set by
        # _compile_with_chains; None: unknown): the chain's record is priced against it.
        self.inductor_keeps: Optional[int] = None

    def _build(self, args):
        from .optimize import optimize
        from .records import report

        clones = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
        devices = sorted({a.device.index or 0 for a in args if a.device.type == "cuda"})
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation
            traced = torch.jit.trace(self.gm, clones, check_trace=False, strict=False)
        keep = (  # memory_budget: the chain's share is planned by the backend
            "min_bytes",
            "max_added_work",
            "assume_numel",
            "dropout_mask_bytes",
            "coupling_anchor_every",
            "coupling_drift_bound",
        )
        opt = optimize(
            traced, clones, **{k: v for k, v in self.policy.items() if k in keep and v is not None}
        )
        found = _priced_under_compile(report(opt), self.inductor_keeps)
        if self.records is not None:
            self.records.extend(found)
        if self.log is not None:
            self.log.extend(found)
        return opt

    def forward(self, *args):
        if not torch.is_grad_enabled():
            return self.gm(*args)
        sig = _signature(args)
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
            return self._first_call(fn, args)
        return fn(*args)

    def _first_call(self, fn, args):
        """The signature's first differentiated call, where the chain measures how well it
        rebuilds each block's input and keeps the exact input of a block off by more than
        coupling_drift_bound from then on (its warning says how many bytes). Under a
        memory target the split's plan counted the chain's outputs only: such a block
        misses the target by its bytes, which a record and a warning say (fuzz seeds 941003,
        941005: 1.10x / 1.09x of the target, silently)."""
        budget = self.policy.get("memory_budget")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = fn(*args)
        drift = 0
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
            m = _DRIFT_BYTES.search(str(w.message))
            drift += int(m.group(1)) if m else 0
        if drift and budget is not None:
            why = (
                f"memory_budget {budget:g} missed: a coupling chain keeps {drift:,} B of its "
                "blocks' exact inputs (rebuilt off by more than coupling_drift_bound on its "
                "first call; see the warning), which the plan did not count"
            )
            warnings.warn("memslim: " + why)
            rec = records_store.note("memory-budget", why, None, drift)
            for where in (self.records, self.log):
                if where is not None:
                    where.append(rec)
        return out


def _priced_under_compile(found: List[Decision], inductor_keeps: Optional[int]):
    """The TorchScript pass prices a chain by what eager autograd keeps for its blocks;
    under torch.compile the blocks would otherwise go to Inductor, whose partitioner keeps
    less (it re-runs cheap ops in backward). With one chain rewritten in the piece, its
    record's figure before is Inductor's for the piece (`inductor_keeps`), eager's named
    beside it."""
    chained = [
        i
        for i, d in enumerate(found)
        if d.pass_ == "invertible-couplings" and d.verdict == "rewrote"
    ]
    if inductor_keeps is None or len(chained) != 1:
        return found
    d = found[chained[0]]
    if d.bytes_before is None or d.bytes_before == inductor_keeps:
        return found
    eager = f"instead of {d.bytes_before} B"
    if eager not in d.text:
        return found
    text = d.text.replace(
        eager,
        f"instead of {inductor_keeps} B (what Inductor's partitioner keeps for these blocks "
        f"unmodified; eager autograd keeps {d.bytes_before} B)",
    )
    rec = dict(d.as_dict(), text=text, bytes_before=inductor_keeps)
    rec["line"] = str(d).replace(d.text, text)
    return found[: chained[0]] + [Decision(rec)] + found[chained[0] + 1 :]


_DRIFT_BYTES = re.compile(r"keeps its exact input \((\d+) B\) from now on")


class _Compiled(torch.nn.Module):
    """A piece compile_fx compiled, as a submodule of the split graph; `single`: the
    piece made one value, which its graph returns as a 1-tuple (AOTAutograd takes
    tuple outputs only). The pieces are compiled for the aten graph's strides, but a
    piece before may return a value with others (Inductor returns a view output, such
    as a torch.chunk half, as a new contiguous tensor; fuzz seed 950006): an argument
    whose strides differ from those it was compiled for is copied into them, as the
    compiled code indexes it by them."""

    def __init__(self, fn, single: bool, ins):
        super().__init__()
        self.fn = fn
        self.single = single
        # per argument: whether it was compiled as needing grad, and its strides
        self.grads = [isinstance(t, torch.Tensor) and t.requires_grad for t in ins]
        self.strides = [
            tuple(t.stride())
            if isinstance(t, torch.Tensor) and all(isinstance(d, int) for d in t.stride())
            else None
            for t in ins
        ]

    def forward(self, *args):
        args = list(args)
        for i, (a, g, st) in enumerate(zip(args, self.grads, self.strides)):
            # A gradient the compiled piece would drop is a wrong result: refuse it loudly.
            if not g and isinstance(a, torch.Tensor) and a.requires_grad:
                raise RuntimeError(
                    "memslim: internal error: a graph piece compiled without "
                    "gradient for an input that requires grad"
                )
            if st is not None and a.stride() != st:
                args[i] = _restrided(a, st)
        out = self.fn(*args)  # as Dynamo calls what a backend returns
        return out[0] if self.single else out


def _restrided(t: torch.Tensor, stride) -> torch.Tensor:
    """`t`'s values in a tensor of strides `stride` (autograd sees the copy)."""
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


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


DYNAMIC = "the graph has dynamic shapes"


def _signature(args) -> tuple:
    """What a trace or a static compile is specialised to: each tensor's shape, strides,
    dtype, device and requires_grad, every other argument's repr."""
    return tuple(
        (tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad)
        if isinstance(a, torch.Tensor)
        else repr(a)
        for a in args
    )


class _PerShape(torch.nn.Module):
    """A graph with dynamic shapes whose coupling chains are split out per input
    signature: at the first call of each signature (shapes, strides, dtypes, requires_grad,
    the values of Dynamo's size inputs, grad mode) `build(args)` makes the graph static
    for those arguments (the backend re-traces Dynamo's graph on them) and splits its
    chains out as for a static graph; later calls of that signature reuse it. Dynamo's
    guards admit every size, so this is the guard: a new size is a new static build, as
    dynamic=False would recompile (each costs one compile), where the chain op and its
    F / G texts would otherwise need symbolic sizes. Past Dynamo's recompile_limit
    signatures, a new one runs Dynamo's graph `gm` eagerly, with one warning, as Dynamo
    runs a frame past that limit."""

    def __init__(self, gm: torch.fx.GraphModule, build: Callable):
        super().__init__()
        self.gm = gm
        self.build = build
        self.by_signature = {}

    def forward(self, *args):
        sig = (torch.is_grad_enabled(), _signature(args))
        fn = self.by_signature.get(sig)
        if fn is None:
            import torch._dynamo.config as dynamo_config

            if len(self.by_signature) >= dynamo_config.recompile_limit:
                warnings.warn(
                    "memslim: a graph with coupling chains met a new input shape after "
                    f"{len(self.by_signature)} compiled ones (torch._dynamo.config."
                    "recompile_limit): it runs eagerly at this shape"
                )
                fn = self.gm
            else:
                fn = self.build(list(args))
            self.by_signature[sig] = fn
        return fn(*args)


def _why_not_split(aten: torch.fx.GraphModule, level) -> Optional[str]:
    """Why the chains of `aten` stay with Inductor (None: they can be split out)."""

    def switches_mode(n):  # grad mode or autocast: split_module keeps them in order only
        name = getattr(n.target, "__name__", str(n.target))
        return n.op == "call_function" and ("set_grad_enabled" in name or "autocast" in name)

    if level is None:
        return "a chain reads a value made after its first node"
    if any(switches_mode(n) for n in aten.graph.nodes):
        # The split moves nodes that do not read a chain before it: across such a switch
        # they would run in another mode (fuzz seeds 929032, 929043, 929044).
        return "the graph switches grad mode or autocast"
    # The pieces are compiled with static shapes in a fake mode of their own (their
    # symbols, unbacked ones of memslim's ops too, must not enter Dynamo's shape
    # environment: its guards failed on them), and a trace is specialised anyway: a
    # dynamic graph's chains are split per input shape (_PerShape) by the backend.
    if not all(
        fx._static_tensor(n.meta.get("val")) or not isinstance(n.meta.get("val"), torch.Tensor)
        for n in aten.graph.nodes
    ) or any(
        isinstance(n.meta.get("val"), torch.SymInt) for n in aten.graph.find_nodes(op="placeholder")
    ):
        return DYNAMIC
    # A plain int input: one a per-shape retrace bound (its value is in the signature).
    if any(
        not isinstance(n.meta.get("val"), (torch.Tensor, int))
        for n in aten.graph.find_nodes(op="placeholder")
    ):
        return "the graph has non-tensor inputs"
    return None


def _split(aten: torch.fx.GraphModule, level):
    """`aten` split by `level` (split_module), its pieces called in numeric order; None
    where the split graph has nodes other than the pieces' calls and their getitems."""
    from torch.fx.passes.split_module import split_module

    split = split_module(aten, None, lambda n: level[n])
    # Run the pieces in numeric order (split_module's own order is any topological one:
    # a piece of writes only, with no edge to the next, could run after it).
    calls = sorted(
        (n for n in split.graph.nodes if n.op == "call_module"),
        key=lambda n: int(n.target.rsplit("_", 1)[1]),
    )
    if any(
        n.op not in ("placeholder", "call_module", "output")
        and not (n.op == "call_function" and n.target is operator.getitem)
        for n in split.graph.nodes
    ):
        return None
    out = next(iter(split.graph.find_nodes(op="output")))
    for c in calls:
        out.prepend(c)
        for u in list(c.users):
            out.prepend(u)
    split.graph.lint()
    return split


def _piece_examples(aten: torch.fx.GraphModule, example_inputs, piece_mode):
    """A function from a piece's placeholder name to its example input: Dynamo's for the
    graph's inputs (parameters stay Parameters: budgets exclude them), the aten graph's
    fake values for the rest (a piece's placeholders are named after the nodes they stand
    for), faked in `piece_mode`."""
    from torch._subclasses.fake_tensor import FakeTensor

    placeholders = list(aten.graph.find_nodes(op="placeholder"))
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

    return example


def _pieces(split, example):
    """(name, module, its example inputs, is_chain, returns one value) of each piece."""
    pieces = []
    for n in split.graph.nodes:
        if n.op != "call_module":
            continue
        sub = getattr(split, n.target)
        ins = [example(p.name) for p in sub.graph.find_nodes(op="placeholder")]
        is_chain = int(n.target.rsplit("_", 1)[1]) % 2 == 1
        single = False if is_chain else _tuple_output(sub)
        pieces.append((n.target, sub, ins, is_chain, single))
    return pieces


def _piece_kept(sub, ins, piece_mode) -> int:
    """What Inductor's partitioner keeps for backward on the piece `sub` unmodified (a
    dry run; parameters excluded)."""
    from torch._subclasses.fake_tensor import FakeTensor

    with _dynamic_output_shapes(piece_mode):
        faked = [
            piece_mode.from_tensor(t)
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor)
            else t
            for t in ins
        ]
        return _partitioned_saved_bytes(
            sub, faked, {i for i, t in enumerate(ins) if isinstance(t, torch.nn.Parameter)}
        )


def _piece_budgets(pieces, piece_mode, budget, whole, target, chains, note):
    """Under a memory budget: each non-chain piece's share of the target (budget.
    piece_shares over what each keeps unmodified, a dry run each), noted."""
    kept = {
        name: _piece_kept(sub, ins, piece_mode)
        for name, sub, ins, is_chain, _ in pieces
        if not is_chain
    }
    chained = sum(after for _, _, after in chains)
    shares, rest, total = piece_shares(target, chained, kept)
    note(
        f"memory_budget {budget:g}: target {target:,} B of the {whole:,} B Inductor's "
        f"partitioner keeps for the unmodified graph; {len(chains)} coupling chain(s) keep "
        f"their outputs ({chained:,} B); the other {len(kept)} piece(s) keep "
        f"{total:,} B unmodified and "
        + ("need no budget" if rest >= total else f"share {max(rest, 0):,} B"),
        whole,
        None,
    )
    return shares, chained


def _compile_piece(compile_piece, sub, ins, piece_mode, strict, records, sub_policy):
    """One non-chain piece compiled by the backend (`compile_piece`) as a graph of its
    own."""
    # A tracing context of its own: AOTAutograd records each compile's metadata
    # in it (Dynamo keeps one for the whole graph), and a piece compiled in the
    # graph's context read the graph's (IndexError in its runtime wrapper).
    # Inductor's caches off for the pieces: a piece whose graph matched another
    # model's piece (same ops, a weight of another shape) was served that piece's
    # code (size assertion at run time; found in the 2026-11-27 tests, not understood).
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    with (
        torch._guards.tracing(torch._guards.TracingContext(piece_mode)),
        inductor_config.patch(fx_graph_cache=False),
        functorch_config.patch(enable_autograd_cache=False),
    ):
        return compile_piece(sub, ins, strict=strict, records=records, _chains=False, **sub_policy)


def _compile_with_chains(
    aten,
    mode,
    fakes,
    example_inputs,
    chains,
    chain_decisions,
    *,
    strict,
    records,
    policy,
    compile_piece: Callable,
    log: Optional[List[Decision]] = None,
    per_shape: Optional[tuple] = None,
):
    """Dynamo's graph with coupling chains: `aten` split around them (split_module), each
    chain a _ChainPiece run eagerly through the TorchScript pass (the FX graph has no op
    that carries F and G as graphs), every other piece compiled by `compile_piece` (the
    backend) as a graph of its own; autograd links the pieces. Under a memory budget the
    target is `budget` of what Inductor's partitioner keeps for the whole unmodified
    graph; the chains keep their outputs (the FX core's price; a block the first call
    finds drifting keeps its input too), and the other pieces share what is left of the
    target in proportion to what each keeps unmodified (each as a budget in bytes); a
    graph that meets the target unmodified is not split (the least added work is none).
    `log`: where the chain pieces' records go besides `records` (the backend's log).
    `per_shape`: for a graph with dynamic shapes, (Dynamo's graph, the backend's static
    build of it for given arguments): _PerShape's. Returns the split graph module (or a
    _PerShape), or None when the chains are not split out (a remark says why)."""

    def note(text, before=None, after=None):
        chain_decisions.append(budget_note(text, before, after, "invertible-couplings"))

    level = _chain_levels(aten, chains)
    why = _why_not_split(aten, level)
    if why == DYNAMIC and per_shape is not None:
        note(
            "coupling chains specialised to each input shape (the graph has dynamic "
            "shapes): the graph is made static and its chains split out at the first "
            "call of each shape"
        )
        return _PerShape(*per_shape)
    if why:
        note("coupling chains left to Inductor: " + why)
        return None
    budget = policy.get("memory_budget")
    if budget is not None:
        skip = {i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)}
        with _dynamic_output_shapes(mode):
            whole = _partitioned_saved_bytes(aten, fakes, skip)
        target = target_bytes(budget, whole)
        if whole <= target:  # the least added work: none
            note(
                f"memory_budget {budget:g}: the unmodified graph keeps {whole:,} B, within "
                f"the target {target:,} B: coupling chains left to Inductor",
                whole,
                whole,
            )
            return None
    split = _split(aten, level)
    if split is None:
        note("coupling chains left to Inductor: the split graph has other nodes")
        return None
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    piece_mode = FakeTensorMode(shape_env=ShapeEnv())
    pieces = _pieces(split, _piece_examples(aten, example_inputs, piece_mode))
    n_chain = len(chains)
    if budget is not None:
        piece_budget, chained = _piece_budgets(
            pieces, piece_mode, budget, whole, target, chains, note
        )
    else:
        note(
            f"{n_chain} coupling chain(s) split out of the graph: each runs as "
            "memslim::coupling_chain through the TorchScript pass (traced at its first "
            "call), the other pieces are compiled by Inductor"
        )
    for name, sub, ins, is_chain, single in pieces:
        if is_chain:
            piece = _ChainPiece(sub, policy, records, strict, log)
            try:  # the chain's record prices it against what Inductor would keep
                piece.inductor_keeps = _piece_kept(sub, ins, piece_mode)
            except Exception:  # noqa: BLE001  (the record keeps eager autograd's figure)
                pass
            setattr(split, name, piece)
            continue
        sub_policy = dict(policy)
        if budget is not None:
            sub_policy["memory_budget"] = piece_budget[name]
        try:
            fn = _compile_piece(compile_piece, sub, ins, piece_mode, strict, records, sub_policy)
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
            _Compiled(fn, single, ins),
        )
    split.recompile()
    return split
