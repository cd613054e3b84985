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
memslim's region op (AOTAutograd would inline the op; cache_keys._region_tags_key says why).
Cache safety: the rewrite happens before Inductor sees the graph, so Inductor's
and AOTAutograd's caches key on the rewritten graph (memslim ops and their
arguments included); the policy is part of the graph it produces; the tags,
node metadata outside the keys, enter them through cache_keys' uuid.
`memslim.compile(model, **policy)` passes policy options; `torch.compile(...,
backend="memslim")` uses the defaults. The backend is registered under the
name "memslim" when memslim is imported, and through the
`torch_dynamo_backends` entry point.
If memslim fails on a graph, the graph is compiled by Inductor unchanged and a
warning says why (strict=True, or MEMSLIM_STRICT=1 as the tests set, raises).
Beside it: budget/ (the memory-budget planner: partition dry runs, torch's knapsack,
memslim's ladders), chains.py (the graph split around coupling chains), cache_keys.py
(Inductor's cache keys for recompute tags), sixteen_bit.py (in a bf16 / fp16 graph, each
rewriting pass kept only where Inductor then keeps fewer bytes with it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from typing import List

import torch

from . import fx
from .budget import BudgetError, budget_note, meet_compile_budget
from .budget import partitioner
from .budget.measure import (
    _dynamic_output_shapes,
    _ladder_base,
    _ladder_overlay,
    _partitioned_saved_bytes,
)
from .cache_keys import _keyed_by_tags
from .chains import _compile_with_chains
from . import _policy, rng_reads, sixteen_bit
from . import records as records_store
from .budget import plan_cache
from ._policy import policy_keywords
from .records import Decision

# Decision records of every graph the backend compiled, in order (the newest
# last); each compiled model also keeps its own, graph by graph (memslim.report(model):
# records.py's store, compiled.py's owner of a graph).
_LOG: List[Decision] = []


def compiled_decisions() -> List[Decision]:
    """The decision records of every graph torch.compile(backend="memslim") compiled."""
    return list(_LOG)


def _aten_graph(gm: torch.fx.GraphModule, example_inputs, static: bool = False):
    """Dynamo's graph as aten ops above autograd, placeholders in the same order; the
    fake mode and the fake inputs it was traced with. static: traced for the real
    `example_inputs` (Dynamo's example values, symbolic under dynamic shapes, ignored):
    every size static and every int input bound to its value (chains._PerShape)."""
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    fakes = [None if static else n.meta.get("example_value") for n in placeholders]
    if any(f is None for f in fakes):  # not from Dynamo: fake the example inputs
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        # Static sizes: a real input's sizes are what it is compiled for. (from_tensor in
        # a mode with a ShapeEnv makes every size a symbol of its own; a graph piece of
        # chains.py given real tensors was then partitioned with symbols no placeholder
        # carries, and tensorify's pass raised KeyError on one: memcnn's RevNet, issue 45.)
        mode = detect_fake_mode(example_inputs) or FakeTensorMode(shape_env=ShapeEnv())
        fakes = _static_fakes(mode, example_inputs)
    mode = detect_fake_mode(fakes)
    # Dynamo's static graphs: the trace of a former process, where the plan cache keeps it.
    k = None if static else plan_cache.graph_key(gm, fakes)
    aten = plan_cache.load_graph(k, mode) if k else None
    if aten is not None:
        with _dynamic_output_shapes(mode):  # (its setting stays, as after a trace)
            aten.shape_env = mode.shape_env
        return _dynamos_inputs(gm, aten), mode, fakes
    with _dynamic_output_shapes(mode):
        # "fake": an int input stays the int it is ("symbolic" makes it a symbol).
        tracing = "fake" if static else "symbolic"
        aten = make_fx(gm, tracing_mode=tracing, pre_dispatch=True)(*fakes)
    if k:
        plan_cache.store_graph(k, aten)
    return _dynamos_inputs(gm, aten), mode, fakes


def _dynamos_inputs(gm: torch.fx.GraphModule, aten: torch.fx.GraphModule):
    """`aten` given what AOTAutograd reads of Dynamo's graph about its inputs: the
    compile id, and each placeholder's source and static-input mark (the parameters and
    buffers Dynamo lifted: `_dynamo_static_input_type`). From them AOTAutograd finds the
    static inputs (frontend_utils._try_get_metadata_from_dynamo), which torch's
    partitioner treats as free to save (config.treat_parameters_as_free_to_save: they
    live anyway) and Inductor's cudagraphs do not copy. Without them make_fx's trace of
    Dynamo's graph had none: torch's knapsack on bert at 0.25 kept the embeddings' sum
    (1.8 MB) where torch.compile's keeps the two id buffers and re-runs the embeddings.
    Only where the placeholders are Dynamo's one for one and the trace lifted no
    constant (AOTAutograd would look a source up for it): else as traced."""
    ours = list(aten.graph.find_nodes(op="placeholder"))
    theirs = list(gm.graph.find_nodes(op="placeholder"))
    if (
        "dynamo_compile_id" not in gm.meta
        or len(ours) != len(theirs)
        or not all(hasattr(n, "_dynamo_source") for n in theirs)
        or next(aten.named_buffers(), None) is not None
        or next(aten.named_parameters(), None) is not None
    ):
        return aten
    aten.meta["dynamo_compile_id"] = gm.meta["dynamo_compile_id"]
    aten._param_name_to_source = {}  # (no lifted parameter: the loop over them is empty)
    for a, d in zip(ours, theirs):
        a._dynamo_source = d._dynamo_source
        if "tensor_dict" in d.meta:
            a.meta["tensor_dict"] = dict(d.meta["tensor_dict"])
    return aten


def _specialize_tensorified_floats(gm: torch.fx.GraphModule) -> None:
    """Asks Dynamo to specialize the Python floats it handed over as tensors. Under
    dynamic=True Dynamo passes a float (LayerNorm's eps, a float argument) as a 0-dim
    tensor input read by `.item()` and leaves it to AOTAutograd's tensorify pass to make
    it a tensor op or to restart Dynamo with it specialized. memslim re-traces the graph
    first (make_fx, then its decisions on constants), where that `.item()` raised
    DataDependentOutputException, which Dynamo takes for a graph break: the frame ran
    eager, without the budget and without a record (fuzz seed 940003, 2026-11-29). So the
    backend specializes them as the pass does for a float it cannot tensorify: each
    float symbol of such an input named in TensorifyState, then a restart."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    from torch._dynamo.symbolic_convert import TensorifyState
    from torch._guards import detect_fake_mode
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    mode = detect_fake_mode([n.meta.get("example_value") for n in gm.graph.nodes])
    env = getattr(mode, "shape_env", None)
    # The floats' symbols, as the pass finds them: by the time the backend runs, Dynamo
    # may have specialized an input's `.item()` already (layer_norm's eps argument),
    # leaving the symbol only in the ShapeEnv.
    new = sorted(
        str(s)
        for s in (env.backed_var_to_val if env is not None else {})
        if symbol_is_type(s, SymT.FLOAT) and not TensorifyState.should_specialize(str(s))
    )
    for name in new:
        TensorifyState.specialize(name)
    if new:
        raise TensorifyScalarRestartAnalysis


def _dynamo_graph_breaks() -> tuple:
    """The exceptions Dynamo takes from a backend as a graph break, not as its failure
    (torch._dynamo.exc.exceptions_allowed_to_be_fallback: the fake-tensor errors): raised
    by memslim under strict=True, the frame would run eager without a word."""
    from torch._dynamo import exc

    return tuple(getattr(exc, "exceptions_allowed_to_be_fallback", ()))


def _compile_passes() -> List[str]:
    """memslim-default as the compile backend runs it: the pass table's pipeline
    (core/pass_table.cpp) with its compile differences, fuse-activation-dropout left out
    there: Inductor fuses dropout's mask generation into its own kernels and does not keep
    dropout's float noise, so the fused op (aten's RNG, an opaque kernel) cost more time
    than it freed bytes (measured: ViT-B/16 with dropout 0.1, -4.1% saved bytes at 1.61x
    torch.compile's step time; bench/results/compile_side_by_side.md)."""
    from . import _C

    return list(_C.pipeline_passes("memslim-default", "compile"))


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
    return budget_note(text, before, after, pass_)


def _chains_first(
    aten,
    serial,
    mode,
    fakes,
    example_inputs,
    policy,
    *,
    strict,
    records,
    per_shape=None,
    peak=False,
):
    """The coupling chains of `aten` split out (chains.py): the split graph module, or None
    where there are none or they stay with Inductor. Their records go to the logs here:
    what a chain became is the TorchScript pass's record (at the chain's first call), or
    the note saying why the chains stayed with Inductor. per_shape: chains.
    _compile_with_chains's (the graph made static for given arguments). peak: a peak
    target is engaged, which plans whole graphs by their predicted and measured step
    peak: chains stay with Inductor (a split graph's pieces were planned by no one, and
    a chain's step peak, its F and G re-run eagerly, is predicted by nothing: fuzz seed
    941181 peaked at 3.6x plain torch.compile's step with no record of the target)."""
    chain_decisions, chains = fx.coupling_chains(aten, policy, serial=serial)
    split = None
    if chains and peak:
        chain_decisions.append(
            _note(
                "coupling chains left to Inductor: peak_memory plans whole graphs by the "
                "step's predicted and measured peak, which a chain's (F and G re-run "
                "eagerly in its backward) is not part of",
                None,
                None,
                "invertible-couplings",
            )
        )
    elif chains:
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
            compile_piece=backend,
            log=_LOG,
            per_shape=per_shape,
        )
    chain_decisions = [d for d in chain_decisions if d.verdict != "rewrote"]
    if chains or any(d.verdict != "note" for d in chain_decisions):
        _LOG.extend(chain_decisions)
        if records is not None:
            records.extend(chain_decisions)
    return split


def _keep_rewrites(
    aten,
    serial,
    mode,
    fakes,
    example_inputs,
    policy,
    needs_grad,
    share=None,
    outcome=None,
    key=None,
    value=None,
):
    """The pipeline's decisions on `aten` and whether to compile them: under a memory
    budget the planner's answer (memslim.budget; `share` and `outcome` as its), else
    whether Inductor's partitioner keeps fewer bytes with the rewrites than without
    (`value`: what the planner judges a plan by, ladder._meet_budget's).
    key: the graph's plan-cache key where the caller made it. Returns (decisions, rewrote,
    the partitioner options to compile with)."""
    budget = policy.get("memory_budget")
    decisions, apply, ladder, _ = fx._plan(
        aten, _compile_passes(), policy, regions="tags", serial=serial, ladders="op"
    )
    rewrote = any(d.verdict == "rewrote" for d in decisions)
    if budget is not None and needs_grad:
        skip = {i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)}
        # The pieces ladder over the unmodified graph (no pass run): tried first; built
        # where the planner first reads it (a plan replayed from the cache that is not
        # one of its steps never does), always before the pipeline's apply().
        plain = _Lazy(
            lambda: fx._plan(aten, [], policy, regions="tags", serial=serial, ladders="tags")[3]
        )
        from .budget import plan_cache

        key = key or plan_cache.key(aten, skip, policy)
        with _dynamic_output_shapes(mode):
            rewrote, options = meet_compile_budget(
                aten,
                fakes,
                apply,
                ladder,
                plain,
                budget,
                skip,
                decisions,
                share,
                outcome,
                key,
                value,
            )
        return decisions, rewrote, options
    if rewrote and needs_grad:
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
                "no gradients in this graph (nothing is kept for backward): graph left to Inductor",
                None,
                None,
            )
        )
    return decisions, rewrote, {}


class _Lazy:
    """A budget ladder built at its first use (a replayed plan needs none; TinyDecoder,
    32 blocks: 0.7 s for its pieces ladder, docs/facts.md)."""

    def __init__(self, build):
        self._build, self._ladder = build, None

    def __getattr__(self, name):
        if self._build is not None:
            self._ladder, self._build = self._build() or _NoLadder(), None
        return getattr(self._ladder, name)


class _NoLadder:
    """What _Lazy stands for where the core built no ladder: no step to take."""

    why, segments, refused, steps, skipped = "no ladder was built", 0, [], [], 0

    def tag(self, k: int) -> None:
        pass


def backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The torch.compile backend (registered as "memslim"): _backend with the user's
    saved_tensors_hooks deferred while it traces, partitions and compiles, as AOTAutograd
    defers them (a hook of the user's, CPU offloading or a counter, would otherwise run on
    memslim's fake tensors: one that reads data_ptr made every graph fall back)."""
    with _user_hooks_deferred():
        return _backend(gm, example_inputs, **kwargs)


def _user_hooks_deferred():
    import torch._dynamo.utils

    hooks = getattr(torch._dynamo.utils, "_disable_saved_tensors_hooks_during_tracing", None)
    return hooks() if hooks is not None else contextlib.nullcontext()


def _backend(
    gm: torch.fx.GraphModule,
    example_inputs,
    *,
    strict: bool = False,
    records=None,
    _chains: bool = True,
    _target=None,
    _static: bool = False,
    **policy,
):
    """The torch.compile backend (registered as "memslim").

    Inductor's partitioner itself recomputes pointwise ops (every activation is on its
    list), so a rewrite that pays in eager may not pay here: when the graph needs
    gradients, both versions are partitioned (no code generated) and the rewritten one is
    compiled only if Inductor then keeps fewer bytes for backward; otherwise the graph goes
    to Inductor unchanged and one "note" record says so. Every graph goes to compile_fx with
    memslim's Inductor guards (inductor_guards.config_patches).
    records: where this graph's records go: None (a graph of what torch.compile made
    whose call is compiling: memslim.report(model), compiled.py), memslim.compile's
    Graphs, or a list (a piece of a graph split around coupling chains). _target:
    memslim.compile's budget.model.ModelTarget, the budget the model's graphs share.
    _static: `gm` traced for the real `example_inputs` with static sizes (a graph with
    dynamic shapes and coupling chains, compiled per shape: chains._PerShape)."""
    from torch._inductor.compile_fx import compile_fx

    from . import compiled, inductor_guards

    policy = _policy.check("memslim backend", policy)
    target = _target if _target is not None and _target.engaged(policy) else None
    if not _static:  # (a per-shape build runs after Dynamo: no restart there)
        _specialize_tensorified_floats(gm)  # before any record: Dynamo restarts the frame
    if not isinstance(records, list):
        records = compiled.graph_records(gm, records, backend)
    try:
        aten, mode, fakes = _aten_graph(gm, example_inputs, static=_static)
        if rng_reads.reads_and_draws(aten):
            return _as_captured(gm, records)
        needs_grad = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
        )
        # The graph as the core reads it, once: the chains, the pipeline and the budget's
        # plain ladder all run over it before anything changes the graph.
        serial = fx._Serializer(
            aten.graph, _leaf_grad(aten, example_inputs), _parameters(aten, example_inputs)
        )
        if _chains and needs_grad:
            # A dynamic graph's chains: this graph again, static per shape (chains._PerShape).
            build = functools.partial(
                backend, gm, strict=strict, records=records, _target=_target, _static=True, **policy
            )
            split = _chains_first(
                aten,
                serial,
                mode,
                fakes,
                example_inputs,
                policy,
                strict=strict,
                records=records,
                per_shape=None if _static else (gm, build),
                peak=target is not None and target.peak is not None,
            )
            if split is not None:
                return split
        budgeted = needs_grad and (target is not None or policy.get("memory_budget") is not None)
        if budgeted:
            code = compiled.last_code(records)  # (read once: it is cleared)
            traced = (aten, mode, fakes, serial)
            how, got = _budget(gm, example_inputs, target, records, policy, _static, traced, code)
            if how == "compiled":
                _LOG.extend(got[0])
                records.extend(got[0])
                return got[1]
            decisions, rewrote, options, aten, mode = got
        else:
            decisions, rewrote, options = _keep_rewrites(
                aten, serial, mode, fakes, example_inputs, policy, needs_grad
            )
            # Kept or left to Inductor as a whole: in 16-bit, each pass again on its own.
            planned = any(d.verdict == "rewrote" for d in decisions)
            if planned and needs_grad and not options and sixteen_bit.sixteen_bit(aten):
                pruned = sixteen_bit.keep_paying_passes(
                    gm, example_inputs, policy, _compile_passes(), decisions, _static
                )
                if pruned is not None:
                    aten, mode, fakes, decisions, rewrote = pruned
    except BudgetError as e:
        records.append(records_store.note("memory-budget", f"unreachable: {e}"))
        raise
    except Exception as e:  # noqa: BLE001  (the user's training must go on)
        if strict or os.environ.get("MEMSLIM_STRICT") == "1":
            if isinstance(e, _dynamo_graph_breaks()):  # else Dynamo runs the frame eager
                raise RuntimeError(f"memslim backend: {type(e).__name__}: {e}") from e
            raise
        why = f"graph compiled by Inductor unchanged: {type(e).__name__}: {e}"
        if policy.get("memory_budget") is not None:
            why += f" (memory_budget {policy['memory_budget']:g} not applied)"
        elif target is not None:
            why += " (peak_memory not applied: the model's predicted peak leaves this graph out)"
        warnings.warn("memslim: " + why)
        records.append(records_store.note("memslim-backend", why))
        _LOG.append(records[-1])
        return compile_fx(gm, example_inputs, config_patches=inductor_guards.config_patches())
    _LOG.extend(decisions)
    records.extend(decisions)
    if not rewrote and not options and not _static:
        return _compile_aten(gm, example_inputs, None, mode, target, None, options)
    # A budget's plan (options) was measured on `aten`: Dynamo's graph partitions
    # otherwise (fuzz seed 940108: torch's knapsack at 0.21875 kept 1,628 B of aten,
    # 1,900 B of Dynamo's graph, over the 1,630 B target). (_static: the static trace,
    # whatever was rewritten: Dynamo's graph is symbolic.)
    return _compile_aten(gm, example_inputs, aten, mode, target, None, options)


def _budget(gm, example_inputs, target, records, policy, static, traced, code):
    """A graph under a budget: ("compiled", (decisions, compiled)) where the planner ran
    inside the compile (budget.partitioner), else ("plan", (decisions, rewrote,
    partitioner options, the graph planned, its fake mode)) for the backend to compile,
    planned the old way (traced dry runs; on a fresh trace where the planning inside
    needed another graph)."""
    aten, mode, fakes, serial = traced

    def plan_of(serial, traced):
        return functools.partial(
            _budget_plan, gm, example_inputs, target, records, policy, static, serial, traced, code
        )

    plan = plan_of(serial, traced[:3])
    if partitioner.available():
        compile_with = functools.partial(
            _compile_aten, gm, example_inputs, aten, mode, target, options={}
        )
        how, got = partitioner.compile_planned(aten, fakes, plan, compile_with, records)
        if how == "compiled":
            return how, got
        if how == "plan":  # a plan made the old way, replayed from the plan cache
            return how, (*got, mode)
        # "retrace": planned the old way, on a fresh trace.
        aten, mode, fakes = _aten_graph(gm, example_inputs, static=static)
        serial = fx._Serializer(
            aten.graph, _leaf_grad(aten, example_inputs), _parameters(aten, example_inputs)
        )
        plan = plan_of(serial, (aten, mode, fakes))
    return "plan", (*plan(), mode)


def _budget_plan(gm, example_inputs, target, records, policy, static, serial, traced, code):
    """The budget's plan of the traced graph `traced` (aten, fake mode, fakes):
    (decisions, rewrote, partitioner options, the graph planned), the model's share
    where memslim.compile set a target (`code`: what Dynamo traced, compiled.last_code),
    else the policy's memory_budget."""
    aten, mode, fakes = traced
    if target is not None:
        return _model_share(
            gm, example_inputs, target, records, policy, (aten, mode, fakes, serial), static, code
        )
    decisions, rewrote, options = _keep_rewrites(
        aten, serial, mode, fakes, example_inputs, policy, True
    )
    return decisions, rewrote, options, aten


def _compile_aten(gm, example_inputs, aten, mode, target, planner, options):
    """Inductor's compile_fx of `aten` (None: of Dynamo's `gm`) with memslim's Inductor
    guards; under a budget, of its plan: `planner` (budget.partitioner's, which plans
    inside the partition step or splits a replayed plan) or, where None, the plan's
    partitioner `options` with its tags on the graph."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    from . import inductor_guards

    guards = inductor_guards.config_patches()  # Inductor's own passes kept right
    # A peak target measures the first step: the backward compiled now, with the forward,
    # so whatever its compile allocates is not in the measured step.
    eager_bw = {"force_non_lazy_backward_lowering": True} if target and target.peak else {}
    with functorch_config.patch(**eager_bw, **options):  # (a budget's FUSED_RECOMPUTE)
        if aten is None:
            return compile_fx(gm, example_inputs, config_patches=guards)
        with contextlib.ExitStack() as stack:
            stack.enter_context(_dynamic_output_shapes(mode))
            if planner is not None:
                # Traced without the ladder's tags; the planner puts them on the joint.
                overlay = _ladder_overlay(aten)
                stack.enter_context(_ladder_base(aten, overlay))
                stack.enter_context(inductor_config.patch(custom_partitioner_fn=planner))
            stack.enter_context(_keyed_by_tags(aten))
            stack.enter_context(_cache_stable(aten))
            return compile_fx(aten, _in_mode(mode, example_inputs), config_patches=guards)


def _in_mode(mode, example_inputs):
    """`example_inputs` as fakes of `mode` where nothing else gives AOTAutograd a fake mode
    (chains._PerShape's static compile hands real tensors, outside Dynamo's tracing
    context): AOTAutograd would make a mode of its own, without a ShapeEnv for static
    sizes, where an op with a data-dependent output size (activation_forward's exact list,
    norm_fallback's channels) cannot be traced (fuzz seed 941028: DynamicOutputShapeException
    in a piece beside a coupling chain). `mode`'s ShapeEnv allows them
    (_dynamic_output_shapes); sizes stay static. Under Dynamo (a tracing context with its
    mode) the inputs stay as they are: AOTAutograd fakes them with Dynamo's symbolic sizes."""
    from torch._guards import detect_fake_mode

    if getattr(mode, "shape_env", None) is None or detect_fake_mode(example_inputs) is not None:
        return example_inputs
    return _static_fakes(mode, example_inputs)


def _static_fakes(mode, example_inputs) -> list:
    """`example_inputs` with each real tensor faked in `mode` at its own, static sizes
    (fakes and other values as they are)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return [
        mode.from_tensor(t, static_shapes=True)
        if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor)
        else t
        for t in example_inputs
    ]


def _as_captured(gm, records):
    """A graph that reads the RNG state and draws random numbers: the read's place among
    the draws matters and Inductor reorders (and seeds) draws, so the graph runs as Dynamo
    captured it, ops in program order, with a record saying so."""
    why = (
        "graph run as captured (eager order): it reads the RNG state "
        "(torch.get_rng_state) and draws random numbers"
    )
    records.append(records_store.note("memslim-backend", why))
    _LOG.append(records[-1])
    return gm.forward


@contextlib.contextmanager
def _cache_stable(aten: torch.fx.GraphModule):
    """`aten` without the ShapeEnv make_fx leaves on it (`aten.shape_env`) while it is
    compiled: AOTAutograd's cache key pickles the module's attributes, and a ShapeEnv
    pickles differently in every process, so memslim's graphs never hit that cache (a
    second process re-traced and re-partitioned every graph: TinyDecoder(depth 4) 12.5 s
    to its first step against torch.compile's 5.7 s, 2026-11-29). Compile reads the
    shape environment from the inputs' fake mode where the module has none."""
    env = aten.__dict__.get("shape_env")
    if env is None:
        yield
        return
    aten.shape_env = None
    try:
        yield
    finally:
        aten.shape_env = env


def _model_share(gm, example_inputs, target, records, policy, traced, static=False, code=None):
    """_keep_rewrites under the model's target (budget.model): this graph's share of it,
    and where the share cannot be met, the graph's smallest reachable plan (the planner
    run again on a fresh trace with that figure as its target) instead of an error: the
    model's target is judged at the end of its forward. Returns (decisions, rewrote,
    options, the aten graph to compile)."""
    from .budget import plan_cache

    slot = target.slot(gm, code)
    aten, mode, fakes, serial = traced
    leaf = (_leaf_grad(aten, example_inputs), _parameters(aten, example_inputs))
    skip = {i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)}
    key = plan_cache.key(aten, skip, policy)
    target.first_graph(key)  # a model settled in another process: its shares

    def share(before):
        return target.graph_target(slot, before)

    planned = target.graph_policy(policy)  # the budget the graph is planned under
    value = target.graph_value(slot)  # None: saved bytes; a peak target's share of the peak

    at_floor = False
    for attempt in range(3):
        outcome = {}
        try:
            decisions, rewrote, options = _keep_rewrites(
                aten,
                serial,
                mode,
                fakes,
                example_inputs,
                planned,
                True,
                share,
                outcome,
                key,
                value,
            )
            break
        except BudgetError as e:
            at_floor, reach = True, getattr(e, "reachable", None)
            note = records_store.note("memory-budget", f"the graph's share not met: {e}")
            records.append(note)
            before = outcome.get("before")
            unmodified = None if before is None else (value or int)(before)
            if reach is None or before is None or reach >= unmodified or attempt == 2:
                # Nothing shrinks it (or the best plan was not found again): unmodified.
                outcome = {"before": before, "kept": before}
                decisions, rewrote, options = [], False, {}
                break
            # The graph's best plan: the planner again, on a fresh trace (the failed
            # attempt applied the pipeline's rewrites to this one), at that figure.
            aten, mode, fakes = _aten_graph(gm, example_inputs, static=static)
            serial = fx._Serializer(aten.graph, *leaf)

            def share(before, reach=reach):
                return reach

    if outcome.get("before") is not None:
        target.add(
            slot,
            outcome["before"],
            outcome.get("target", outcome["before"]),
            outcome.get("kept", outcome["before"]),
            at_floor,
            records,
        )
    return decisions, rewrote, options, aten


@policy_keywords("memslim.compile")
def compile(
    model,
    *,
    strict: bool = False,
    fullgraph: bool = False,
    dynamic=None,
    mode=None,
    options=None,
    on_unreachable: str = "error",
    peak_memory=None,
    optimizer=None,
    policy: dict,
):
    """torch.compile(model, backend="memslim") with memslim's policy keywords (every
    entry point's, below; ValueError when out of range). fullgraph / dynamic: as torch.compile's.
    memslim.report(result) (or of `model`) gives the decision records of the graphs
    compiled so far, memslim.summary(result) their per-pass summary.
    memory_budget: the model's graphs keep at most this fraction (in (0, 1]) of what
    Inductor's partitioner keeps for them unmodified (parameters excluded: the fraction
    torch's activation_memory_budget is of), or this many bytes (> 1), all graphs
    together: a graph that cannot shrink (a loss head behind a graph break) leaves its
    share to the others (memslim.budget.model; each graph's plan: ladder._meet_budget).
    The first training forward plans the model (it may run the forward again to
    re-plan, the generator and buffers restored). A target the model cannot meet raises
    BudgetError at the end of that forward, before any backward, naming the model's
    smallest reachable figure; on_unreachable="warn" takes that plan and warns.
    peak_memory: the training step's peak tensor memory instead (bytes, or a size such as
    "6GB" / "6GiB"): the parameters, buffers, inputs, gradients and, with `optimizer`,
    its state, plus what forward and backward allocate; the planner predicts the peak
    from its dry runs (budget.model.StepPeak) and plans the saved bytes into what the
    rest leaves; the report's "the model" record gives the predicted peak and its parts."""
    if mode is not None or options is not None:
        raise ValueError(
            "memslim.compile: mode/options are Inductor's; set them with "
            "torch._inductor.config.patch(...) around the call"
        )
    from ._transformers import join_loss_graph

    graphs = records_store.Graphs("memslim.compile")
    graphs.strict = strict
    note = join_loss_graph(model)
    if note is not None:  # before any graph: the model as memslim.compile found it
        graphs.add("memslim.compile (before tracing)", [note])
    target = None
    if peak_memory is not None and policy.get("memory_budget") is not None:
        raise ValueError(
            "memslim.compile: give memory_budget (saved bytes) or peak_memory (the step's "
            "peak), not both"
        )
    if optimizer is not None and peak_memory is None:
        raise ValueError("memslim.compile: optimizer= is read only with peak_memory=")
    if policy.get("memory_budget") is not None or peak_memory is not None:
        from .budget.model import ModelTarget, parse_bytes

        peak = parse_bytes(peak_memory) if peak_memory is not None else None
        target = ModelTarget(policy.get("memory_budget"), on_unreachable, peak, optimizer)
        target.codes = graphs.codes  # the code objects to re-plan: Dynamo's for the graphs
    be = functools.partial(backend, strict=strict, records=graphs, _target=target, **policy)
    compiled = torch.compile(model, backend=be, fullgraph=fullgraph, dynamic=dynamic)
    # torch.get_rng_state as an op while the model runs: no graph break per read.
    if isinstance(compiled, torch.nn.Module):
        compiled.forward = rng_reads.traced(compiled.forward)
    else:
        compiled = rng_reads.traced(compiled)
    if target is not None:
        from .budget.model import planned

        if isinstance(compiled, torch.nn.Module):
            compiled.forward = planned(compiled.forward, target, model)
        else:
            compiled = planned(compiled, target, model)
    records_store.keep(compiled, graphs)
    if isinstance(model, torch.nn.Module) and records_store.lookup(model) is None:
        records_store.keep(model, graphs)  # memslim.report(model) for the module kept
    return compiled


def _register() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "memslim" not in _COMPILER_FNS:
        register_backend(name="memslim")(backend)
    from . import fallbacks

    fallbacks.watch()  # frames Dynamo gives up on: counted, or raised under strict
