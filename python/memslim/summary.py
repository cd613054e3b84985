"""memslim.summary(x): the decision records of what memslim touched, on one screen.

What: per graph (a compiled model's graphs by compile id; one for a ScriptModule or an
exported program), per pass: sites decided, rewritten, kept with the main reasons, and
the bytes the rewritten sites keep for backward before -> after (the cost model's
prices); the fallbacks first (a graph memslim's backend left to Inductor after failing on
it, a frame Dynamo gave up on: records.FALLBACK_PASSES); the graph's own notes (what Inductor's partitioner keeps without / with the
rewrites, a budget's plan, a fallback) one line each. The counts are the C++ core's
per-pass statistics (core/statistics.cpp through Records.statistics(), as memslim-opt
--stats counts them), not a second counter.
Why: a model's report runs to hundreds of records; the summary is for those who will
not read them.
"""

from __future__ import annotations

from typing import List

from .records import Records, report

WIDTH = 100  # a line's most characters
FULL_GRAPHS = 4  # graphs shown pass by pass; the rest one line each
REASONS = 2  # kept reasons shown per pass
NOTES = 4  # notes shown per graph


class Summary(str):
    """The summary's text; a REPL shows it as text."""

    def __repr__(self) -> str:
        return str(self)


def _b(n) -> str:
    return f"{n:,} B"


def _clip(text: str, width: int = WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _pass_lines(records: Records) -> List[str]:
    out = []
    for s in records.statistics():
        if not s["sites"] and not s["rolled_back"]:
            continue
        line = f"  {s['pass']:<32} {s['sites']:>5} {s['rewritten']:>7} {s['kept']:>5}"
        if s["bytes_before"] or s["bytes_after"]:
            line += f"   {_b(s['bytes_before'])} -> {_b(s['bytes_after'])}"
        if s["rolled_back"]:
            line += f"   rolled back {s['rolled_back']}x"
        out.append(line)
        reasons = s["kept_by_reason"]
        for why, n in reasons[:REASONS]:
            out.append(_clip(f"      kept {n}: {why}"))
        if len(reasons) > REASONS:
            more = sum(n for _, n in reasons[REASONS:])
            out.append(f"      kept {more}: {len(reasons) - REASONS} other reason(s)")
    return out


def _note_lines(records: Records) -> List[str]:
    notes = [d for d in records if d.verdict == "note"]
    out = []
    for d in notes[:NOTES]:
        if d.bytes_before is not None and d.bytes_after is not None:
            # The figures, then the note's verdict (the text after its first ": ").
            text = f"{_b(d.bytes_before)} -> {_b(d.bytes_after)}: {d.text.split(': ', 1)[-1]}"
        else:
            text = d.text
        out.append(_clip(f"  note {d.pass_}: {text}"))
    if len(notes) > NOTES:
        out.append(f"  {len(notes) - NOTES} more note(s): memslim.report(x)")
    return out


def _totals(records: Records) -> str:
    stats = records.statistics()
    sites = sum(s["sites"] for s in stats)
    rewritten = sum(s["rewritten"] for s in stats)
    before = sum(s["bytes_before"] for s in stats)
    after = sum(s["bytes_after"] for s in stats)
    text = f"{sites} sites, {rewritten} rewritten, {sites - rewritten} kept"
    return text + (f"; the rewritten keep {_b(before)} -> {_b(after)}" if before or after else "")


def _unchanged(records: Records) -> str:
    """Where the backend compiled the graph as Dynamo gave it (its notes say so: Inductor
    keeps less without the rewrites, no gradients, memslim failed on it)."""
    for d in records:
        if d.verdict == "note" and (
            d.pass_ == "memslim-backend" or d.text.endswith("graph left to Inductor")
        ):
            return " (none applied: graph left to Inductor)"
    return ""


def summary(obj) -> Summary:
    """A one-screen summary of memslim.report(obj) (the same objects; ValueError for one
    memslim never saw): per graph, per pass, sites, rewritten, kept with the main
    reasons, and the rewritten sites' bytes before -> after; each graph's notes."""
    rep = report(obj)
    graphs = getattr(rep, "graphs", [("records", rep)])
    lines = [f"memslim summary: {type(obj).__name__} through {rep.source}: {len(graphs)} graph(s)"]
    if len(graphs) > 1:
        lines.append("  all graphs: " + _totals(rep))
    fallbacks = rep.fallbacks()
    if fallbacks:  # each one memslim's plan not run: first, whatever else the screen holds
        lines.append(f"  fallbacks: {len(fallbacks)} (memslim.report(x).fallbacks())")
        lines += [_clip(f"    {d.pass_}: {d.text}") for d in fallbacks[:NOTES]]
    if not graphs:
        lines.append("  no graph compiled yet (torch.compile compiles at the first call)")
    for i, (name, records) in enumerate(graphs):
        if i >= FULL_GRAPHS:
            lines.append(_clip(f"{name}: {_totals(records)}"))
            continue
        lines += [_clip(name), "  " + _totals(records) + _unchanged(records)]
        passes = _pass_lines(records)
        if passes:
            lines.append(f"  {'pass':<32} {'sites':>5} {'rewrote':>7} {'kept':>5}   bytes kept")
            lines += passes
        lines += _note_lines(records)
    return Summary("\n".join(lines) + "\n")
