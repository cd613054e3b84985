"""One memory target for the whole model: the compiled graphs share it.

What: ModelTarget, memslim.compile's budget for the model it compiles: a fraction of what
Inductor's partitioner keeps for all of the model's graphs unmodified (parameters
excluded), or bytes for all of them. Graph breaks make several graphs, compiled one by
one as the first forward reaches them, so a graph's share is set before the graphs
after it are seen:
- first round (the first training forward): each graph gets what keeps the model so far
  within the target (a fraction f: f x (the unmodified bytes of the graphs so far) minus
  what the earlier graphs keep; bytes: the target minus what the earlier graphs keep). A
  graph that cannot meet its share takes its smallest reachable plan (the planner's
  best, never an error inside a graph's compile) and the deficit stays with the model;
- at the end of the forward (`planned`, the compiled model's forward wrapper), the
  model's sum against the target: met; or a deficit that the graphs which met their
  shares may still cover: the forward is run again (the generator and the module's
  buffers restored first, the output dropped, Dynamo's cache of these graphs' code
  reset), the graphs now planned with shares that leave the deficit to them (a graph
  that cannot shrink, a loss head, keeps its smallest figure); or unreachable for the
  model: BudgetError naming the model's smallest reachable figure, raised before any
  backward of the training step ran (on_unreachable="warn": the best plan, a warning).
Graphs compiled after the model is settled (a new input shape, a recompile) take their
slot's settled share, as a fraction of their own unmodified bytes.
Why: a budget per graph failed a transformers GPT-2 whose loss graph could not shrink,
while the model as a whole could meet the budget (issue 48).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from . import BudgetError, budget_note, target_bytes


@dataclass
class GraphPlan:
    """One graph of a round: its slot, what its partition keeps unmodified (`before`),
    its target, what its plan keeps, and whether that is its smallest reachable (it
    could not meet its target)."""

    slot: Tuple
    before: int
    target: int
    kept: int
    at_floor: bool
    records: List = field(default_factory=list)


class ModelTarget:
    """memslim.compile's target for one model (see the module's docstring)."""

    MAX_ROUNDS = 3  # forwards run in the first step: the first plus two re-plans

    def __init__(self, budget: float, on_unreachable: str = "error"):
        if on_unreachable not in ("error", "warn"):
            raise ValueError(
                f"memslim.compile: on_unreachable must be 'error' or 'warn', got {on_unreachable!r}"
            )
        self.budget = budget
        self.on_unreachable = on_unreachable
        self.round: List[GraphPlan] = []  # graphs compiled in this round
        self.settled: Dict[Tuple, float] = {}  # slot -> fraction of its own bytes
        self.shares: Dict[Tuple, int] = {}  # slot -> bytes, for the next round
        self.floors: Dict[Tuple, int] = {}  # slot -> smallest reachable, where met
        self.codes = set()  # the code objects Dynamo compiled the graphs for
        self.rounds = 0
        self.active = False  # a round is running (the first forward, or a re-plan)
        self.verdict: Optional[str] = None
        self.model_key: Optional[str] = None  # plan_cache's key of the settled shares

    # -- the backend's side: one graph --------------------------------------------------

    def slot(self, gm, code) -> Tuple:
        """The graph's place in the model: the code Dynamo traced and how many graphs of
        it this round compiled before (a re-plan compiles them in the same order)."""
        name = (code.co_filename, code.co_firstlineno, code.co_name) if code is not None else None
        return (name, sum(1 for g in self.round if g.slot[0] == name))

    def first_graph(self, cache_key: Optional[str]) -> None:
        """The round's first graph has `cache_key` (plan_cache.key): a model settled
        before with it (another process) gives its shares to this round."""
        if not self.active or self.round or self.rounds != 1 or cache_key is None:
            return
        from . import plan_cache

        self.model_key = plan_cache.model_key(self.budget, cache_key)
        stored = plan_cache.lookup_model(self.model_key)
        if stored:
            self.shares = {_tuple(slot): b for slot, b in stored}

    def graph_target(self, slot: Tuple, before: int) -> int:
        """The bytes this graph may keep (`before`: its unmodified partition's)."""
        if not self.active:  # after the model is settled: its slot's fraction
            frac = self.settled.get(slot)
            if frac is None:
                frac = self.budget if self.budget <= 1 else self._settled_fraction()
            return max(2, int(frac * before))
        if slot in self.shares:
            return self.shares[slot]
        kept = sum(g.kept for g in self.round)
        if self.budget <= 1:
            seen = sum(g.before for g in self.round) + before
            return max(2, int(self.budget * seen) - kept)
        return max(2, int(self.budget) - kept)

    def add(self, slot, before, target, kept, at_floor, records) -> None:
        if self.active:
            self.round.append(GraphPlan(slot, before, target, kept, at_floor, records))

    def _settled_fraction(self) -> float:
        total = sum(g.before for g in self.round)
        return (sum(g.kept for g in self.round) / total) if total else 1.0

    # -- the model's side: the end of a forward -----------------------------------------

    def _target(self) -> int:
        return target_bytes(self.budget, sum(g.before for g in self.round))

    def settle(self) -> str:
        """After a round's forward: "met", "replan" (shares set for another round) or
        "unreachable"; "idle" where the round compiled no graph under a budget."""
        if not self.round:
            return "idle"
        target, kept = self._target(), sum(g.kept for g in self.round)
        for g in self.round:
            if g.at_floor:
                self.floors[g.slot] = g.kept
        if kept <= target:
            return "met"
        floor = sum(self.floors.get(g.slot, 0) for g in self.round)
        free = [g for g in self.round if g.slot not in self.floors]
        if not free or self.rounds >= self.MAX_ROUNDS:
            return "unreachable"
        if floor >= target:
            # Unreachable whatever the others keep: one more round takes every graph to
            # its smallest plan, the figure the error names (and the plan "warn" takes).
            self.shares = {g.slot: self.floors.get(g.slot, 2) for g in self.round}
            return "replan"
        # The graphs that met their shares take the deficit, in proportion to what
        # they keep now; the others keep their smallest figures.
        room = target - floor
        held = sum(g.kept for g in free)
        self.shares = {g.slot: self.floors[g.slot] for g in self.round if g.slot in self.floors}
        for g in free:
            self.shares[g.slot] = max(2, int(room * g.kept / held)) if held else 2
        return "replan"

    def smallest(self) -> int:
        """The model's smallest figure known: each graph's floor where it reached one,
        else what it keeps (its floor is at most that)."""
        return sum(self.floors.get(g.slot, g.kept) for g in self.round)

    def error(self) -> BudgetError:
        total = sum(g.before for g in self.round)
        target = self._target()
        parts = "; ".join(
            f"graph {i}: {g.kept:,} of {g.before:,} B" + (" (its smallest)" if g.at_floor else "")
            for i, g in enumerate(self.round)
        )
        return BudgetError(
            f"memory_budget {self.budget:g} for the model ({target:,} B of the {total:,} B "
            f"its {len(self.round)} graph(s) keep unmodified) cannot be met: the smallest "
            f"reachable found is {self.smallest():,} B ({self.smallest() / max(total, 1):.3f} "
            f"of the unmodified; {parts}); take that plan with "
            "memslim.compile(..., on_unreachable='warn')"
        )

    def close(self, verdict: str) -> None:
        """The round's plan becomes the model's: later graphs of a slot take its fraction."""
        self.verdict = verdict
        self.settled = {g.slot: (g.kept / g.before if g.before else 1.0) for g in self.round}

        total = sum(g.before for g in self.round)
        kept = sum(g.kept for g in self.round)
        text = (
            f"the model: {kept:,} B kept of the {total:,} B its {len(self.round)} graph(s) "
            f"keep unmodified, target {self._target():,} B (memory_budget {self.budget:g}): "
            + {
                "met": "met",
                "unreachable": "not met; the smallest reachable plan taken (on_unreachable='warn')",
            }[verdict]
            + (f", after {self.rounds} forwards (re-planned)" if self.rounds > 1 else "")
        )
        for g in self.round:
            g.records.append(budget_note(text, total, kept))
        if self.model_key is not None:
            from . import plan_cache

            shares = [[list(g.slot), g.kept if g.at_floor else g.target] for g in self.round]
            plan_cache.store_model(self.model_key, shares)


def _tuple(v):
    """A slot read back from JSON (lists) as the tuple it was."""
    return tuple(_tuple(x) for x in v) if isinstance(v, list) else v


def _snapshot(model, args, kwargs):
    """What a forward changes that a re-run must start from again: the generators (CPU
    and the inputs' CUDA devices) and the module's buffers (BatchNorm's running stats)."""
    tensors = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
    devices = sorted({t.device.index or 0 for t in tensors if t.is_cuda})
    cpu = torch.random.get_rng_state()
    cuda = [torch.cuda.get_rng_state(d) for d in devices]
    buffers = (
        [(b, b.detach().clone()) for b in model.buffers()]
        if isinstance(model, torch.nn.Module)
        else []
    )

    def restore():
        torch.random.set_rng_state(cpu)
        for d, s in zip(devices, cuda):
            torch.cuda.set_rng_state(s, d)
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)

    return restore


def planned(forward, target: ModelTarget, model):
    """`forward` (what torch.compile made) under the model's target: the first forward
    with gradients plans the model (see the module's docstring)."""

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if target.verdict is not None or not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        restore = _snapshot(model, args, kwargs)
        while True:
            target.round, target.active = [], True
            target.rounds += 1
            try:
                out = forward(*args, **kwargs)
            finally:
                target.active = False
            verdict = target.settle()
            if verdict == "idle":
                target.rounds -= 1
                return out
            if verdict == "met":
                target.close("met")
                return out
            if verdict == "unreachable":
                if target.on_unreachable == "error":
                    del out
                    restore()  # the step did not happen: buffers and generator as before
                    raise target.error()
                warnings.warn("memslim: " + str(target.error()).split(";")[0] + ": best plan taken")
                target.close("unreachable")
                return out
            del out  # re-plan: the first forward's saved tensors go before the next
            for g in target.round:
                g.records.append(
                    budget_note(
                        "superseded: the model missed its target with this plan; its "
                        "forward ran again with the graphs' shares re-planned"
                    )
                )
            restore()
            from torch._dynamo import reset_code

            for code in target.codes:
                reset_code(code)

    return run
