"""Decision records: the one type, the one store, and memslim.report.

What: `Decision` (one record of a pass at one site; as a str, the remark line), `Records`
(the list memslim.report returns, with `statistics()` / `stats_text()`: per pass, sites
decided, rewritten, kept by reason, bytes freed, counted by the C++ core from the same
records memslim-opt --stats counts), and the store that maps whatever memslim produced (a
ScriptModule from memslim.optimize, an ExportedProgram or GraphModule from
memslim.fx.optimize, a model from memslim.compile) to its records. `report(x)` answers
for every one of them and names the ways in otherwise.
Why one module: the records used to live in three stores, one per entry point, and
memslim.report knew only two of them.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable, List, Optional

from . import _C


class Decision(str):
    """One decision record of a pass at one site (passes/include/memslim/core/decision.h).
    As a str it is the remark line, `remark: <pass>: rewrote|kept <site>: ...`, so code
    that reads remarks as text keeps working; the fields are the record:
    pass_, verdict ("rewrote", "kept", "rolled back", "note"), site, text (the reason,
    or the pass's sentence), bytes_before / bytes_after (what the original and the
    rewrite keep for backward, as the cost model prices them; None where unpriced),
    added_work (activation evaluations per element), freed_bytes, and rule: the safety
    gate's rule that refused the rewrite (passes/include/memslim/core/gate_rules.h), or
    None."""

    def __new__(cls, rec: dict) -> "Decision":
        self = super().__new__(cls, rec["line"])
        self.pass_ = rec["pass"]
        self.verdict = rec["verdict"]
        self.site = rec["site"]
        self.text = rec["text"]
        self.bytes_before = rec["bytes_before"]
        self.bytes_after = rec["bytes_after"]
        self.added_work = rec["added_work"]
        self.rule = rec.get("rule")
        return self

    @property
    def freed_bytes(self) -> Optional[int]:
        if self.bytes_before is None or self.bytes_after is None:
            return None
        return self.bytes_before - self.bytes_after

    def as_dict(self) -> dict:
        return {
            "pass": self.pass_,
            "verdict": self.verdict,
            "site": self.site,
            "text": self.text,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "added_work": self.added_work,
            "rule": self.rule,
            "line": str(self),
        }


class Records(list):
    """The decision records of one optimized object, in order (a list of Decision)."""

    def statistics(self) -> List[dict]:
        """Per pass, in order of first appearance: {pass, sites, rewritten, kept,
        rolled_back, bytes_freed, kept_by_reason: [(reason class, count)]}."""
        return _C.pass_statistics([d.as_dict() for d in self])[0]

    def stats_text(self) -> str:
        """The statistics as memslim-opt --stats prints them."""
        return _C.pass_statistics([d.as_dict() for d in self])[1]


# What memslim produced -> its records (weak: the records go with the object).
_STORE: "weakref.WeakKeyDictionary[Any, List[Decision]]" = weakref.WeakKeyDictionary()


def remember(obj, records: Iterable[Decision]) -> List[Decision]:
    """Keeps `records` as `obj`'s (the list itself, so a compiled model's records grow
    as it compiles graphs) and returns it. Objects that cannot be weakly referenced or
    hashed are not remembered."""
    records = records if isinstance(records, list) else list(records)
    try:
        _STORE[obj] = records
    except TypeError:
        pass
    return records


def lookup(obj) -> Optional[List[Decision]]:
    try:
        return _STORE.get(obj)
    except TypeError:
        return None


def report(obj) -> Records:
    """The decision records (Decision: as a str, the remark line) of what memslim made
    `obj` from: memslim.optimize's ScriptModule, memslim.fx.optimize's program, or
    memslim.compile's model (the graphs compiled so far). A list with .statistics() /
    .stats_text(): per pass, sites decided, rewritten, kept by reason and bytes freed
    (as memslim-opt --stats prints them)."""
    found = lookup(obj)
    if found is None:
        raise ValueError(
            "memslim.report: memslim did not produce this object; the ways in are "
            "memslim.optimize(module) (TorchScript), memslim.fx.optimize(exported program) "
            'and memslim.compile(model); for torch.compile(model, backend="memslim"), '
            "memslim.compiled_decisions() has every graph's records"
        )
    return Records(found)
