"""The memory-budget planner: one package for every way in.

What: BudgetError (a budget the compile way cannot meet), target_bytes (the target every
way resolves the same: a budget in (0, 1] is a fraction of the unmodified figure, one
> 1 is bytes), budget_note (the "note" records the planner writes), piece_shares (the
target split among a split graph's pieces), and the two entry points:
meet_compile_budget (memslim.compile: ladder._meet_budget over Inductor's partition dry
runs, measure.py; torch's own knapsack among its ways, knapsack.py) and
meet_script_budget (memslim.optimize: the TorchScript planner asked for a fraction of
its own figure and held to measured bytes, torchscript.py).
Why: the planner used to live in optimize.py and ~650 lines of backend.py with the
target, the notes and the error written in each. The two ways still plan differently
underneath (the TorchScript planner's static model against Inductor's dry-run
partitions), but enter, resolve the target and write their notes here. The ladders are
the C++ core's (core/recompute_blocks.h, passes/jit/memory_budget.cpp): C++ builds them
and applies a step, this package measures and chooses.
"""

from __future__ import annotations

from typing import Dict, Optional

from ..records import Decision, note


class BudgetError(ValueError):
    """A memory budget the backend cannot meet on a graph. Raised, not warned about:
    a graph compiled over the budget the user asked for would run out of memory later."""


def target_bytes(budget: float, reference: int) -> int:
    """The bytes a budget allows: floor(budget * reference) for a fraction in (0, 1],
    else the budget itself in bytes (memory_budget's range is the C++ policy table's)."""
    return int(budget * reference) if budget <= 1 else int(budget)


def budget_note(text: str, before=None, after=None, pass_: str = "memory-budget") -> Decision:
    """A "note" record (no site) of `pass_` with `text` and the bytes it is about."""
    return note(pass_, text, before, after)


def piece_shares(target: int, chained: int, kept: Dict[str, int]):
    """A split graph's budget (memslim.compile with coupling chains): what is left of
    `target` once the chains keep `chained` bytes, shared among the other pieces in
    proportion to what each keeps unmodified (`kept`), each share a budget in bytes (at
    least 2: a budget of 1 would be a fraction). None: the piece needs no budget (the rest
    covers every piece, or it keeps nothing). Returns (shares, rest, total kept)."""
    rest = target - chained
    total = sum(kept.values())
    shares: Dict[str, Optional[int]] = {}
    for name, b in kept.items():
        shares[name] = None if rest >= total or b == 0 else max(2, int(rest * b / total))
    return shares, rest, total


from .ladder import _meet_budget as meet_compile_budget  # noqa: E402
from .torchscript import meet_script_budget, meet_script_peak  # noqa: E402

__all__ = [
    "BudgetError",
    "budget_note",
    "meet_compile_budget",
    "meet_script_budget",
    "meet_script_peak",
    "piece_shares",
    "target_bytes",
]
