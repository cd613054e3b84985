"""Decision records: the one type, the one store, and memslim.report.

What: `Decision` (one record of a pass at one site; as a str, the remark line), `Records`
(the list memslim.report returns, with `statistics()` / `stats_text()`: per pass, sites
decided, rewritten, kept by reason, bytes freed and the rewritten sites' bytes before /
after, counted by the C++ core from the same records memslim-opt --stats counts; and
`graphs`: the records graph by graph), and the store that maps whatever memslim touched to
its graphs' records: a ScriptModule from memslim.optimize, an ExportedProgram or
GraphModule from memslim.fx.optimize, memslim.compile's model, and whatever
torch.compile(..., backend="memslim") made (compiled.py finds it while a graph compiles).
`report(x)` answers for every one of them and names the four ways in otherwise.
Why one module: the records used to live in three stores, one per entry point, and
memslim.report knew only two of them.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable, List, Optional, Tuple

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


def note(pass_: str, text: str, before=None, after=None) -> Decision:
    """A "note" record (no site) of `pass_` with `text` and the bytes it is about."""
    return Decision(
        {
            "pass": pass_,
            "verdict": "note",
            "site": "",
            "text": text,
            "line": f"remark: {pass_}: " + text,
            "bytes_before": before,
            "bytes_after": after,
            "added_work": None,
        }
    )


class Records(list):
    """The decision records of one object memslim touched, in order (a list of Decision).
    `graphs`: [(name, Records)] graph by graph (a compiled model: one per graph Dynamo
    handed the backend, named by its compile id and frame; "shared" in the name where
    Dynamo's cache serves another object's graph to this one); `source`: how memslim saw
    the object (memslim.summary's heading)."""

    graphs: List[Tuple[str, "Records"]]
    source: str

    def statistics(self) -> List[dict]:
        """Per pass, in order of first appearance: {pass, sites, rewritten, kept,
        rolled_back, bytes_freed, bytes_before, bytes_after (the rewritten sites',
        priced), kept_by_reason: [(reason class, count)]}."""
        return _C.pass_statistics([d.as_dict() for d in self])[0]

    def stats_text(self) -> str:
        """The statistics as memslim-opt --stats prints them."""
        return _C.pass_statistics([d.as_dict() for d in self])[1]

    def fallbacks(self) -> List[Decision]:
        """The notes saying memslim's plan did not run: a graph its backend compiled by
        Inductor unchanged (memslim failed on it), a frame Dynamo gave up on (fallbacks.py:
        it runs eager). Under strict mode each of them is an error instead."""
        return [d for d in self if d.verdict == "note" and d.pass_ in FALLBACK_PASSES]


# The record passes of fallbacks: memslim's backend (backend.py), Dynamo (fallbacks.py).
FALLBACK_PASSES = ("memslim-backend", "dynamo-fallback")


class Graphs:
    """What memslim made of one object: its graphs in order, each [name, records list]
    (the lists themselves: a compiled model's graphs and a coupling chain's records
    arrive as it runs). `source`: the way in; `share_key`: for torch.compile's objects,
    (backend, code object) whose Dynamo cache entries other objects may be served."""

    def __init__(self, source: str, share_key=None):
        self.source = source
        self.share_key = share_key
        self.graphs: List[Tuple[str, List[Decision]]] = []
        self.codes = set()  # the code objects Dynamo traced for its graphs
        self.strict = False  # memslim.compile(strict=True): a fallback raises

    def add(self, name: str, records: Optional[List[Decision]] = None) -> List[Decision]:
        """A graph named `name` (", part N" added where a compile hands the backend
        several graphs under one name: DDP's optimizer compiles a graph per bucket)."""
        records = [] if records is None else records
        taken = sum(n == name or n.startswith(name + ", part ") for n, _ in self.graphs)
        self.graphs.append((name + (f", part {taken + 1}" if taken else ""), records))
        return records

    def last(self) -> List[Decision]:
        return self.graphs[-1][1]


# What memslim touched -> its Graphs (weak: the records go with the object).
_STORE: "weakref.WeakKeyDictionary[Any, Graphs]" = weakref.WeakKeyDictionary()


def remember(obj, records: Iterable[Decision], source: str = "") -> List[Decision]:
    """Keeps `records` as `obj`'s one graph (the list itself) and returns it. Objects
    that cannot be weakly referenced or hashed are not remembered."""
    records = records if isinstance(records, list) else list(records)
    graphs = Graphs(source or type(obj).__name__)
    graphs.add(source or type(obj).__name__, records)
    keep(obj, graphs)
    return records


def keep(obj, graphs: Graphs) -> Graphs:
    """`graphs` as `obj`'s (a compiled model's, which grow as it compiles)."""
    try:
        _STORE[obj] = graphs
    except TypeError:
        pass
    return graphs


def lookup(obj) -> Optional[Graphs]:
    try:
        return _STORE.get(obj)
    except TypeError:
        return None


def known() -> List[Graphs]:
    """Every object's Graphs, in no order (compiled.py's shared graphs)."""
    return list(_STORE.values())


WAYS_IN = (
    'torch.compile(model, backend="memslim"), memslim.compile(model), '
    "memslim.fx.optimize(torch.export.export(model, args)) and "
    "memslim.optimize(model, example_inputs)"
)


def report(obj) -> Records:
    """The decision records (Decision: as a str, the remark line) of what memslim made
    `obj` from: a model or function compiled with torch.compile(backend="memslim") or
    memslim.compile (the graphs compiled so far; the original module too),
    memslim.fx.optimize's program, memslim.optimize's ScriptModule, a model holding such
    blocks (their graphs, named by the block's path). A list with
    .statistics() / .stats_text() (per pass, as memslim-opt --stats prints them) and
    .graphs (graph by graph). ValueError for an object memslim never saw."""
    from . import compiled, fallbacks

    graphs = lookup(obj)
    if graphs is None:
        graphs = compiled.graphs_of(obj)  # torch.compile's wrappers, shared graphs
    if graphs is None:
        graphs = compiled.graphs_of_parts(obj)  # a model of compiled / optimized blocks
    if graphs is None:
        raise ValueError(
            f"memslim.report: memslim never saw this {type(obj).__name__}"
            f"{compiled.why_unknown(obj)}; the four ways in are {WAYS_IN}"
        )
    listed = list(graphs.graphs) + fallbacks.frames_given_up(obj, graphs)
    out = Records(d for _, records in listed for d in records)
    out.graphs = [(name, Records(records)) for name, records in listed]
    out.source = graphs.source
    return out
