"""Tables, saved-tensor breakdown and plots of the benchmark suite (bench/suite.py).

What: turns the workers' JSON rows into suite.md (full table, headline table, the check that
saved_tensors_hooks see torch.compile's saved tensors), suite_breakdown.md (which saved
tensors torch.compile avoids that memslim keeps) and the saved-bytes-vs-batch plots.
Why separate: rendering is pure (rows in, text out), so it can be re-run on a suite.json.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Iterable, List, Optional, Tuple

from _suite_models import SPECS, VARIANT_TITLES, VARIANTS

Item = Tuple[tuple, str, int]  # (shape, dtype, storage bytes) of one saved storage


# ---- cells ---------------------------------------------------------------------------


def _mb(b) -> str:
    return f"{b / 1e6:,.1f} MB"


def _pct(b, ref) -> str:
    return f"{100 * (b - ref) / ref:+.1f}%" if ref else ""


def _sci(v) -> str:
    if v != v:  # NaN: eager's own gradients were not finite (FracAct models after one SGD step)
        return "nan: eager grads not finite"
    return "inf" if v == float("inf") else f"{v:.1e}"


def reason(row: dict) -> str:
    """One line: why (part of) a row has no number."""
    errs = row.get("errors") or {}
    return "; ".join(f"{k}: {v}" for k, v in errs.items())


def _cell(row: Optional[dict], key: str, fmt) -> str:
    if row is None:
        return "not run"
    if key in row and row[key] is not None:
        return fmt(row[key])
    return "failed"


# ---- suite.md ------------------------------------------------------------------------

FULL_HEADER = (
    "| model | input | variant | saved bytes | vs eager | peak RSS MiB | step RSS growth MiB "
    "| first step s | step ms | ratio to eager | grad rel. diff step 1: max tensor / all "
    "| after 3 steps: max tensor / all (worst) | notes |"
)


def _grad(r: dict, key: str) -> str:
    """'max / global (worst tensor)' of one step's gradient comparison."""
    if r.get(f"grad_rel_{key}") is None:
        return "failed"
    v, g = r[f"grad_rel_{key}"], r.get(f"grad_glob_{key}")
    if v != v:
        return "eager grads not finite"
    out = _sci(v) + (f" / {_sci(g)}" if g is not None else "")
    if key == "last" and r.get("grad_worst_last"):
        out += f" ({r['grad_worst_last']})"
    return out


def full_table(
    rows: Dict[Tuple[str, str], dict], models: Iterable[str], variants: Iterable[str]
) -> List[str]:
    """Every (model, variant): a number in each column or, in notes, the reason why not."""
    out = [FULL_HEADER, "|" + "---|" * 3 + "---:|" * 9 + "---|"]
    for m in models:
        eager = (rows.get((m, "eager")) or {}).get("saved_bytes")
        for v in variants:
            r = rows.get((m, v))
            if r is None:
                r = {"errors": {"run": "not run"}}
            growth = None
            if r.get("rss_step_peak_mib") is not None and r.get("rss_base_mib", -1) >= 0:
                growth = r["rss_step_peak_mib"] - r["rss_base_mib"]
            grad1, gradn = (
                (_grad(r, "step1"), _grad(r, "last")) if v != "eager" else ("reference",) * 2
            )
            notes = "; ".join(s for s in (r.get("note", ""), reason(r)) if s)
            out.append(
                "| "
                + " | ".join(
                    [
                        m,
                        SPECS[m].shape if m in SPECS else "",
                        VARIANT_TITLES[v],
                        _cell(r, "saved_bytes", lambda b: f"{b:,}"),
                        _pct(r["saved_bytes"], eager)
                        if r.get("saved_bytes") is not None and eager
                        else "",
                        _cell(r, "ru_maxrss_mib", lambda x: f"{x:,.0f}"),
                        f"{growth:,.0f}" if growth is not None else "failed",
                        _cell(r, "first_step_s", lambda x: f"{x:.1f}"),
                        _cell(r, "step_ms", lambda x: f"{x:,.0f}"),
                        _cell(r, "step_ratio", lambda x: f"{x:.2f}"),
                        grad1,
                        gradn,
                        notes.replace("|", "/"),
                    ]
                )
                + " |"
            )
    return out


def headline_table(rows, models) -> List[str]:
    """Per model: saved bytes (change vs eager) and step-time ratio of memslim next to
    torch.compile's (default and budget 0.5) and per-block checkpointing's."""
    cols = ("memslim", "compile", "compile_budget", "ckpt")
    out = [
        "| model | eager saved | " + " | ".join(VARIANT_TITLES[c] for c in cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    for m in models:
        e = rows.get((m, "eager")) or {}
        cells = [m, _mb(e["saved_bytes"]) if e.get("saved_bytes") else "failed"]
        for c in cols:
            r = rows.get((m, c)) or {}
            if r.get("saved_bytes") is None:
                cells.append("n/a: " + (reason(r) or "not run")[:60].replace("|", "/"))
                continue
            s = _mb(r["saved_bytes"])
            if e.get("saved_bytes"):
                s += f" ({_pct(r['saved_bytes'], e['saved_bytes'])})"
            s += f", x{r['step_ratio']:.2f}" if r.get("step_ratio") is not None else ", time n/a"
            cells.append(s)
        out.append("| " + " | ".join(cells) + " |")
    return out


def hooks_check_table(rows, models) -> List[str]:
    """saved_tensors_hooks (memslim.saved_bytes) against the autograd-graph walk."""
    out = [
        "| model | variant | saved_tensors_hooks | graph walk | equal |",
        "|---|---|---:|---:|---|",
    ]
    for m in models:
        for v in ("eager", "compile", "compile_budget"):
            r = rows.get((m, v)) or {}
            if r.get("saved_bytes") is None:
                continue
            w = r.get("saved_graph_walk")
            out.append(
                f"| {m} | {VARIANT_TITLES[v]} | {r['saved_bytes']:,} | "
                f"{'hidden' if w is None else f'{w:,}'} | "
                f"{'-' if w is None else ('yes' if w == r['saved_bytes'] else 'NO')} |"
            )
    return out


# ---- breakdown -----------------------------------------------------------------------


def _items(row) -> Counter:
    """Saved storages of a row as a multiset keyed by (bytes, dtype). Not by shape: the same data
    is often saved under another shape (memslim's 4x64x3072 is torch.compile's 3072x256, the
    transposed matmul operand), and would then show up on both sides of the difference."""
    return Counter((b, d) for s, d, b in row.get("saved_tensors") or [])


def _shapes(row) -> Dict[Tuple[int, str], List[str]]:
    """(bytes, dtype) -> the shapes under which this row saved storages of that size."""
    out: Dict[Tuple[int, str], List[str]] = {}
    for s, d, b in row.get("saved_tensors") or []:
        shape = "x".join(map(str, s)) or "scalar"
        if shape not in out.setdefault((b, d), []):
            out[(b, d)].append(shape)
    return out


def saved_difference(keeps: dict, avoids: dict) -> Tuple[Counter, Counter]:
    """Multisets of saved storages, keyed by (bytes, dtype): what `keeps` saves that `avoids`
    does not, and the reverse. Storages are matched by size and dtype only (tensor identity
    cannot be compared across processes)."""
    a, b = _items(keeps), _items(avoids)
    return a - b, b - a


def _eager_hint(eager_row: Optional[dict]) -> Dict[Tuple[int, str], str]:
    """(bytes, dtype) -> the eager autograd nodes that save a storage of that size: which op a
    tensor most likely belongs to (TorchScript and torch.compile do not name their nodes)."""
    hint: Dict[Tuple[int, str], Counter] = {}
    for node, items in ((eager_row or {}).get("saved_by_node") or {}).items():
        for _, d, b in items:
            hint.setdefault((b, d), Counter())[
                node.replace("Backward0", "").replace("Backward1", "")
            ] += 1
    return {
        k: ", ".join(f"{n}x{c}" if c > 1 else n for n, c in v.most_common(4))
        for k, v in hint.items()
    }


def _diff_lines(diff: Counter, shapes, hint, limit: int = 12) -> List[str]:
    out = [
        "| shapes | dtype | bytes each | count | total | saved in eager by |",
        "|---|---|---:|---:|---:|---|",
    ]
    groups = sorted(diff.items(), key=lambda kv: -kv[0][0] * kv[1])
    for (nbytes, dtype), n in groups[:limit]:
        out.append(
            f"| {', '.join(shapes.get((nbytes, dtype), [])[:3])} | {dtype} | {nbytes:,} | {n} | "
            f"{nbytes * n:,} | {hint.get((nbytes, dtype), '-')} |"
        )
    if len(groups) > limit:
        rest = groups[limit:]
        out.append(
            f"| ({len(rest)} more sizes) | | | {sum(n for _, n in rest)} | "
            f"{sum(k[0] * n for k, n in rest):,} | |"
        )
    out.append(
        f"| **total** | | | {sum(diff.values())} | {sum(k[0] * n for k, n in diff.items()):,} | |"
    )
    return out


def breakdown(rows, models, force: bool = False) -> List[str]:
    """For each model where torch.compile saves fewer bytes than memslim (or every model,
    `force`): the saved storages only memslim keeps and those only torch.compile keeps."""
    out: List[str] = []
    for m in models:
        ms, co = rows.get((m, "memslim")) or {}, rows.get((m, "compile")) or {}
        if not ms.get("saved_tensors") or not co.get("saved_tensors"):
            continue
        if not force and co["saved_bytes"] >= ms["saved_bytes"]:
            continue
        keeps, avoids = saved_difference(ms, co)
        hint = _eager_hint(rows.get((m, "eager")))
        out += (
            [
                f"## {m} ({SPECS[m].shape if m in SPECS else ''})",
                "",
                f"memslim.optimize saves {ms['saved_bytes']:,} B in {sum(_items(ms).values())} storages; "
                f"torch.compile {co['saved_bytes']:,} B in {sum(_items(co).values())}.",
                "",
                "Kept by memslim, not by torch.compile:",
                "",
            ]
            + _diff_lines(keeps, _shapes(ms), hint)
            + ["", "Kept by torch.compile, not by memslim:", ""]
            + _diff_lines(avoids, _shapes(co), hint)
            + [""]
        )
    return out or ["No model where torch.compile saves fewer bytes than memslim.optimize.", ""]


# ---- plots ---------------------------------------------------------------------------


def plot_sweep(model: str, sweeps: Dict[str, dict], path: str, shape: str) -> Optional[str]:
    """Saved bytes vs batch size, one line per variant. Returns None or why not plotted."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed"
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    # eager thick and dashed: torch.compile's line can lie on top of it (BERT)
    styles = {
        "eager": dict(ls="--", lw=3, alpha=0.6),
        "compile": dict(ls="-", lw=1.5),
        "memslim": dict(ls="-", lw=1.5),
    }
    for v in ("eager", "compile", "memslim"):
        pts = {int(b): n for b, n in ((sweeps.get(v) or {}).get("sweep") or {}).items()}
        if pts:
            bs = sorted(pts)
            ax.plot(
                bs, [pts[b] / 1e6 for b in bs], marker="o", label=VARIANT_TITLES[v], **styles[v]
            )
    ax.set_xlabel("batch size")
    ax.set_ylabel("saved for backward (MB)")
    ax.set_title(f"{model}, {shape}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


__all__ = [
    "full_table",
    "headline_table",
    "hooks_check_table",
    "breakdown",
    "saved_difference",
    "plot_sweep",
    "reason",
    "VARIANTS",
]
