"""The zoo run's verdicts and table (bench/zoo.py).

What: the criteria (GRAD_FACTOR, GRAD_FLOOR, PRED_TOL, the phases whose failures are
memslim's), `verdict` (a finished row's flags: crash / refusal / error / more bytes /
gradient worse / prediction) and `render` (the Markdown table of the cached rows, in
named sections: header, summary, failures, all models, notes).
Why separate: classifying and rendering are pure (rows in, flags and text out), apart from
running the models; `zoo.py --render` re-renders a cache without running anything.
"""

from __future__ import annotations

import os
import re

# Gradient criterion: memslim's distance to eager may exceed neither GRAD_FACTOR x the unmodified
# module's distance nor GRAD_FACTOR x eager fp32's own rounding error (distance to fp64),
# whichever is larger; GRAD_FLOOR where neither could be measured.
GRAD_FACTOR = 10.0
GRAD_FLOOR = 1e-6
PRED_TOL = 0.05  # prediction "within 5%" of the measured difference
# Phases in which a signal / error is memslim's (optimize or running what it produced).
MEMSLIM_PHASES = ("optimize", "opt_grads", "opt_saved")


def verdict(r: dict) -> dict:
    """Flags of a finished row: crash / refusal / error (memslim's or before it) / more_bytes /
    grad_worse / rewrote / pred_ok."""
    v = {}
    ph = r.get("phase", "")
    if r.get("signal"):
        v["crash"] = ph in MEMSLIM_PHASES
        v["crash_before"] = not v["crash"]
    if r.get("timeout"):
        v["timeout"] = True
    if r.get("refused"):
        v["refusal"] = True
    if r.get("error"):
        if ph in MEMSLIM_PHASES:
            v["opt_error"] = True
        else:
            v["setup_error"] = True
    if "opt_saved" in r and "script_saved" in r:
        v["measured"] = True
        v["more_bytes"] = r["opt_saved"] > r["script_saved"]
        meas = r["script_saved"] - r["opt_saved"]
        v["rewrote"] = bool(r.get("rewrites")) or r.get("predicted", 0) != 0
        if v["rewrote"]:
            v["pred_ok"] = abs(r["predicted"] - meas) <= PRED_TOL * max(abs(meas), 1)
    if "d_opt" in r and "d_script" in r:
        dopt = max(r["d_opt"])
        dscr = max(r["d_script"])
        noise = (
            max(x for x in (dscr, r.get("d_eager_fp64", 0.0) or 0.0) if x == x)
            if dscr == dscr
            else float("nan")
        )
        if dopt != dopt or dscr != dscr:  # nan: eager's own gradients not finite
            v["grad_nonfinite"] = True
        else:
            v["grad_worse"] = dopt > GRAD_FACTOR * max(noise, GRAD_FLOOR)
    return v


def fmt_bytes(b) -> str:
    return "" if b is None else f"{b:,}"


def fmt_d(x) -> str:
    if x is None:
        return ""
    return "nan" if x != x else f"{x:.1e}"


# The verdict flags that put a model under "Failures and errors" (and --rerun-failed reruns).
FLAGS = (
    "crash",
    "crash_before",
    "timeout",
    "refusal",
    "opt_error",
    "setup_error",
    "more_bytes",
    "grad_worse",
)


def _render_intro(rs: list, meta: dict) -> list:
    """The table's header: the run, its settings, the columns and the criteria; the revisions
    the rows were measured on where they are not all this one."""
    import torch

    lines = [
        "# Zoo run: memslim.optimize over torchvision / transformers / timm models (issue 9)",
        "",
        f"{meta['date']}, torch {torch.__version__}, memslim git {meta['git']}; "
        f"{meta['cpu']}, {meta['jobs']} workers x {meta['threads']} torch thread(s) "
        "(machine shared with other jobs).",
        "",
        f"Command: `{meta['command']}`",
        "",
        "Settings: random weights from configs (nothing downloaded, HF_HUB_OFFLINE=1), seed 0, "
        "dropout / drop-path p=0, train mode, batch 2, images 64x64 unless the architecture needs "
        "more (the `input` column), transformers at hidden 128 / 2 layers / 4 heads / 2x32 tokens, "
        "loss = sum of mean squares of every floating output. Each model: script (trace where "
        "scripting fails: `how`), `memslim.optimize(scripted, example_inputs=inputs)`, both run in "
        "one subprocess per model.",
        "",
        "Columns: saved bytes = `memslim.saved_bytes` (2 warm-up training steps) of eager, of the "
        "unmodified scripted/traced module and of the optimized one; predicted = "
        "`memslim.predicted_bytes_freed`; measured = unmodified - optimized; gradients: global "
        "relative L2 distance of (input + every parameter) gradients to eager fp32's after one "
        "forward/backward, worst of call 1 (profiling run) and call 3; `eager vs fp64`: eager fp32's "
        "own distance to an fp64 eager run (rounding noise; blank above 100M parameters or where fp64 "
        "does not run).",
        "",
        f"Criteria: **more bytes**: optimized > unmodified. **gradient worse**: memslim's distance > "
        f"{GRAD_FACTOR:g} x max(unmodified's distance, eager-vs-fp64, {GRAD_FLOOR:g}). **prediction "
        f"within 5%**: |predicted - measured| <= 5% of measured, over models with a rewrite. **crash**: "
        "a signal in optimize or in running its result (a signal before that is torch's, listed "
        "apart). **refusal**: optimize raised.",
        "",
    ]
    revs = {}
    for r in rs:
        revs[r.get("git", "?")] = revs.get(r.get("git", "?"), 0) + 1
    if len(revs) > 1 or (revs and next(iter(revs)) != meta["git"]):
        lines += [
            "Rows measured on: "
            + "; ".join(f"memslim git {g}: {n} models" for g, n in revs.items())
            + " (each row's `git` in the JSON-lines cache).",
            "",
        ]
    return lines


def _render_summary(rs: list, vs: dict, names: list) -> list:
    """The summary: counts per source and per verdict."""
    cnt = lambda k: sum(1 for r in rs if vs[r["model"]].get(k))  # noqa: E731
    by_src = {}
    for r in rs:
        src = r.get("source") or r["model"].split("/")[0]
        by_src[src] = by_src.get(src, 0) + 1
    n_rew = cnt("rewrote")
    return [
        "## Summary",
        "",
        f"- models run: {len(rs)} of {len(names)} selected ("
        + ", ".join(f"{k} {v}" for k, v in sorted(by_src.items()))
        + ")",
        f"- measured end to end (unmodified and optimized saved bytes): {cnt('measured')}",
        f"- **crashes (memslim): {cnt('crash')}**; signals before optimize (torch/model): {cnt('crash_before')}; "
        f"timeouts: {cnt('timeout')}",
        f"- **refusals (optimize raised): {cnt('refusal')}**; errors running the optimized module: "
        f"{cnt('opt_error')}; setup errors before optimize (model does not build/script/trace): "
        f"{cnt('setup_error')}",
        f"- **more bytes than the unmodified module: {cnt('more_bytes')}**",
        f"- **gradient worse than the unmodified module's: {cnt('grad_worse')}**; eager gradients not "
        f"finite: {cnt('grad_nonfinite')}",
        f"- models with a rewrite: {n_rew}; **prediction within 5% of the measurement: "
        f"{cnt('pred_ok')} of {n_rew}**",
        "",
    ]


def _render_failures(rs: list, vs: dict) -> list:
    """The flagged models with what went wrong, and the predictions off by more than 5%."""
    lines = []
    fails = [(r, vs[r["model"]]) for r in rs]
    flagged = [(r, v) for r, v in fails if any(v.get(k) for k in FLAGS)]
    if flagged:
        lines += ["## Failures and errors", ""]
        for r, v in flagged:
            what = [k for k in FLAGS if v.get(k)]
            detail = r.get("refused") or r.get("error") or ""
            if r.get("signal"):
                detail = f"{r['signal']} in phase {r.get('phase')}"
            if v.get("more_bytes"):
                detail = (
                    f"optimized {r['opt_saved']:,} B > unmodified {r['script_saved']:,} B "
                    f"(+{r['opt_saved'] - r['script_saved']:,} B; predicted freed {r['predicted']:,} B)"
                )
            if v.get("grad_worse"):
                detail += f" gradient distance {max(r['d_opt']):.1e} vs unmodified {max(r['d_script']):.1e}"
            lines.append(f"- `{r['model']}`: {', '.join(what)}: {detail}")
        lines.append("")
    bad_pred = [(r, v) for r, v in fails if v.get("rewrote") and not v.get("pred_ok")]
    if bad_pred:
        lines += [
            "## Predictions off by more than 5%",
            "",
            "| model | predicted freed | measured freed | error |",
            "|---|---:|---:|---:|",
        ]
        for r, v in bad_pred:
            meas = r["script_saved"] - r["opt_saved"]
            err = (r["predicted"] - meas) / meas if meas else float("inf")
            lines.append(f"| {r['model']} | {r['predicted']:,} | {meas:,} | {err:+.1%} |")
        lines.append("")
    return lines


def _model_row(n: str, r: dict, v: dict) -> str:
    """One model's row of the "All models" table."""
    how = r.get("how", "")
    how = "scripted" if how == "scripted" else ("traced" if how.startswith("traced") else how)
    status = []
    for k, txt in (
        ("crash", "CRASH"),
        ("crash_before", "signal before optimize"),
        ("timeout", "timeout"),
        ("refusal", "REFUSED"),
        ("opt_error", "ERROR"),
        ("setup_error", "setup error"),
        ("more_bytes", "MORE BYTES"),
        ("grad_worse", "GRADIENT WORSE"),
        ("grad_nonfinite", "eager grads not finite"),
    ):
        if v.get(k):
            status.append(txt)
    if v.get("rewrote") and not v.get("pred_ok"):
        status.append("prediction off")
    if not status:
        status.append("ok")
    vs_unmod = ""
    if "opt_saved" in r and r.get("script_saved"):
        vs_unmod = f"{(r['opt_saved'] - r['script_saved']) / r['script_saved']:+.1%}"
    rew = ", ".join(f"{k} {c}" for k, c in (r.get("rewrites") or {}).items())
    return (
        f"| {n} | {r.get('shape', '')} | {how} | {r.get('n_params', 0) / 1e6:.1f}M | "
        f"{fmt_bytes(r.get('eager_saved'))} | {fmt_bytes(r.get('script_saved'))} | "
        f"{fmt_bytes(r.get('opt_saved'))} | {vs_unmod} | {fmt_bytes(r.get('predicted'))} | {rew} | "
        f"{fmt_d(max(r['d_script']) if 'd_script' in r else None)} | "
        f"{fmt_d(max(r['d_opt']) if 'd_opt' in r else None)} | {fmt_d(r.get('d_eager_fp64'))} | "
        f"{'; '.join(status)} |"
    )


def _render_notes(rows: dict, names: list, md_path: str) -> list:
    """Why models were traced (grouped: transformers' configs all fail alike), where fp64
    failed, and the findings file's link when there is one."""
    lines = []
    traced, fp64 = {}, []
    for n in names:
        r = rows.get(n, {})
        if r.get("how", "").startswith("traced"):
            why = re.sub(
                r"\b\w+Config\b", "<Config>", re.sub(r" using inspect\.\w*\)?$", ")", r["how"])
            )
            traced.setdefault(why, []).append(n)
        if r.get("fp64_error"):
            fp64.append(f"- `{n}`: no fp64 reference ({r['fp64_error'][:150]})")
    if traced or fp64:
        lines += ["## Notes", ""]
        for why, ns in traced.items():
            lines.append(f"- {why}: {', '.join(f'`{n}`' for n in ns)}")
        lines += fp64
        lines.append("")
    findings = os.path.join(os.path.dirname(md_path), "zoo_findings.md")
    if os.path.exists(findings):
        lines += [
            "Findings, minimal repros and explanations: [zoo_findings.md](zoo_findings.md).",
            "",
        ]
    return lines


def render(rows: dict, names: list, md_path: str, meta: dict) -> str:
    """Writes the Markdown table of the cached rows of `names` to md_path; returns its text."""
    rs = [rows[n] for n in names if n in rows]
    vs = {r["model"]: verdict(r) for r in rs}
    lines = _render_intro(rs, meta) + _render_summary(rs, vs, names) + _render_failures(rs, vs)
    lines += [
        "## All models",
        "",
        "| model | input | how | params | eager saved | unmodified saved | memslim saved | vs unmod. "
        "| predicted freed | rewrites | grad dist unmod. | grad dist memslim | eager vs fp64 | status |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for n in names:
        r = rows.get(n)
        if r is None:
            lines.append(f"| {n} | | | | | | | | | | | | | not run |")
            continue
        lines.append(_model_row(n, r, vs[n]))
    lines.append("")
    lines += _render_notes(rows, names, md_path)
    text = "\n".join(lines)
    with open(md_path, "w") as f:
        f.write(text)
    return text
