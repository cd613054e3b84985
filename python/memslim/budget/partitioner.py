"""The compile way's planner as Inductor's partitioner: one trace of the joint per graph.

What: `compile_planned` compiles a graph under a memory budget with Inductor's
`custom_partitioner_fn` set to a _Planner. AOTAutograd traces the joint graph once and
Inductor's joint passes run once; the planner (`plan`, the backend's budget planning:
ladder._meet_budget) then runs inside the partition step, every dry run a min-cut of a
copy of that joint (measure._JOINTS seeded with it; a ladder step's tags put on by node
provenance, measure._retag), and the plan taken is split from the joint itself, so the
figures the planner decided by are the compile's partition by construction. A plan in the
plan cache is replayed before the compile (no dry run: measure's "replay" mode raises
NeedsPlanning where there is none) and compiled under the partitioner key of the compile
that made it (its "uuid" in the plan), so a second process finds AOTAutograd's cache.
Where planning needs another graph traced (the pipeline's rewrites, the graph's share
planned again on a fresh trace), a dry run raises Retrace out of the compile and the
backend plans the old way (traced dry runs, then the compile), as it does where torch
has no custom partitioner or the user set one.
Why: before, a first step under a budget traced the joint for the unmodified graph's dry
run, again for the compile, and ran torch's knapsack twice (the dry run's and the
compile's): TinyDecoder at 32 blocks 1.78x torch.compile's first step at the same budget
(2026-11-30), where the issue's bar is 1.2x.
"""

from __future__ import annotations

import contextlib
import uuid as uuid_lib
from typing import Callable, Optional

from . import BudgetError, measure


class NeedsPlanning(Exception):
    """The plan cache holds no plan for the graph (measure's "replay" mode)."""


class Retrace(Exception):
    """A dry run inside the compile needs a graph the compile did not trace."""


def available() -> bool:
    """Whether this torch takes a custom partitioner memslim may set (torch 2.14's
    `custom_partitioner_fn`, with partition_fn's override for the dry runs' own splits),
    and the user set none."""
    try:
        from torch._inductor import config
        from torch._inductor.custom_graph_pass import CustomPartitionerFn  # noqa: F401
    except ImportError:
        return False
    return (
        hasattr(config, "custom_partitioner_fn")
        and config.custom_partitioner_fn is None
        and measure._overridable()
    )


def _partitioner_class():
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    class Planner(CustomPartitionerFn):
        """Inductor's partition step for one graph: the planner's dry runs on copies of
        the joint (where `result` is not known yet), then the plan taken split from it."""

        memslim = True  # (measure._joint_key shares joints under it, not under a user's)

        def __init__(self, aten, fakes, plan, key, result=None):
            self.aten, self.fakes, self.plan, self.key = aten, fakes, plan, key
            self.result = result  # (decisions, rewrote, options, aten) once planned
            # A replayed plan's tags, read now: the compile traces the graph with them off
            # (measure._ladder_base), and the split puts them on the joint.
            self.overlay = measure._ladder_overlay(aten) if result is not None else None

        def __deepcopy__(self, memo):
            # Inductor's cache key copies its config (custom_partitioner_fn included)
            # and hashes this one by uuid(): the graph and its fakes are not copied.
            return self

        def __reduce__(self):
            # Pickled for the caches' keys (FxGraphCachePickler): its key stands for it.
            return (_PlannerKey, (self.key,))

        def uuid(self):
            # AOTAutograd's and Inductor's caches key on it: a fresh planning's is new,
            # a replayed plan's is the one its planning compiled under.
            return _PlannerKey(self.key)

        def __call__(self, gm, joint_inputs, **kwargs):
            from torch._functorch import config as functorch_config
            from torch._functorch.partitioners import min_cut_rematerialization_partition

            if self.result is None:
                # (the seeded copy and the dry runs' modules leave no source behind)
                with (
                    _inside(self.key),
                    measure.shared_joints(),
                    measure._forget_fx_sources(self.aten),
                ):
                    joint_key = measure._joint_key(self.aten, self.fakes)
                    if joint_key is None:
                        raise Retrace("the joint graph cannot be shared")
                    split = {k: v for k, v in kwargs.items() if k != "compiler"}  # (min_cut's)
                    measure._JOINTS[joint_key] = (measure._copy(gm), joint_inputs, split)
                    try:
                        self.result = self.plan()
                    except (BudgetError, Retrace):
                        raise
                    except Exception as e:  # noqa: BLE001
                        # A dry run on the compile's joint that the old way's traced
                        # joint would not meet (fuzz seed 941000: a size input the
                        # compile's trace holds as an int, which torch's knapsack
                        # cannot size): the old way, on a fresh trace.
                        raise Retrace(f"{type(e).__name__}: {e}") from e
            options, planned = self.result[2], self.result[3]
            if planned is not self.aten:
                raise Retrace("the plan is of another trace")
            overlay = self.overlay
            if overlay is None:  # planned just now, inside: the tags are on the graph
                overlay = measure._ladder_overlay(self.aten)
            try:
                measure._retag_or_raise(gm, self.aten, overlay)
            except measure.NoProvenance as e:  # the compile takes the tags traced on
                raise Retrace(str(e)) from e
            kwargs.setdefault("compiler", "inductor")
            with functorch_config.patch(**options):
                return min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)

    return Planner


class _PlannerKey(tuple):
    """What a _Planner pickles to in Inductor's and AOTAutograd's cache keys."""

    def __new__(cls, key):
        return super().__new__(cls, ("memslim-planner", key))


@contextlib.contextmanager
def _inside(key: str):
    """The dry runs see the seeded joint only (a trace raises Retrace), and a plan stored
    in the plan cache records the partitioner key it is compiled under."""
    before = (measure._STATE["mode"], measure._STATE["uuid"])
    measure._STATE.update(mode="inside", uuid=key)
    try:
        yield
    finally:
        measure._STATE["mode"], measure._STATE["uuid"] = before


@contextlib.contextmanager
def _replay_only():
    before = measure._STATE["mode"]
    measure._STATE.update(mode="replay", replayed_uuid=None)
    try:
        yield
    finally:
        measure._STATE["mode"] = before


def compile_planned(aten, fakes, plan: Callable, compile_with: Callable, records: list):
    """`aten` compiled under its budget's plan, planned inside the compile's partition
    step (or replayed from the plan cache before it). plan(): the backend's planning of
    `aten` (decisions, rewrote, partitioner options, the graph planned). compile_with(
    partitioner): the backend's compile of `aten` with that custom partitioner. Returns
    ("compiled", (decisions, compiled)); ("plan", the plan) where the plan cache's was
    made the old way (the pipeline's rewrites, a fresh trace: the backend compiles it
    so); or ("retrace", None) where the planning needs another trace (Retrace): then
    nothing of it is left in `records` and the backend plans the old way."""
    first = len(records)
    try:
        with _replay_only():
            result = plan()
        key = measure._STATE.get("replayed_uuid")
    except NeedsPlanning:
        del records[first:]
        result, key = None, None
    if result is not None:
        if not key or result[3] is not aten:
            return "plan", result
        planner = _partitioner_class()(aten, fakes, plan, key, result)
    else:
        planner = _partitioner_class()(aten, fakes, plan, uuid_lib.uuid4().hex)
    try:
        compiled = compile_with(planner)
    except Retrace:
        del records[first:]
        return "retrace", None
    if planner.result is None:
        # The compile never partitioned a joint, so nothing was planned inside it (fuzz
        # seed 941102): the old way plans it.
        del records[first:]
        return "retrace", None
    return "compiled", (planner.result[0], compiled)


def replayed(plan: dict) -> None:
    """ladder._replay's hook: the replayed plan's partitioner key, for compile_planned."""
    measure._STATE["replayed_uuid"] = plan.get("uuid")


def replay_only(has_plan: bool) -> None:
    """ladder._meet_budget's check: in the replay-only pass, a graph without a cached
    plan raises NeedsPlanning (before any dry run)."""
    if measure._STATE["mode"] == "replay" and not has_plan:
        raise NeedsPlanning()


def plan_key() -> Optional[str]:
    """The partitioner key a plan made now is compiled under (None: made the old way)."""
    return measure._STATE["uuid"] if measure._STATE["mode"] == "inside" else None
