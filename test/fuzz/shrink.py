"""Minimizes a fuzzer finding (issue 9): edits a generated `Program` while the failure
keeps its signature (class, stage, and for exceptions the error's first words).

Edits, repeated until none applies: drop an output or an output term; delete a
statement (every later use of the values it defined is rewired to an earlier value
of the same shape, its own operand first); replace an if / loop by one branch / one
unrolled iteration; switch the dtype to fp32, the mode to train or eval, drop unused
arguments. Candidates run in a persistent worker (crash-isolated, runner.Session), so a
SIGSEGV finding shrinks like any other. The result is printed with values renumbered.
"""

from __future__ import annotations

import copy
import os
import re
import sys
from typing import Callable, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gen  # noqa: E402
import runner  # noqa: E402


def signature(res: dict) -> tuple:
    cls, stage = res.get("class"), res.get("stage", "")
    if cls == "exception":
        detail = res.get("detail", "")
        words = re.sub(r"\[.*?\]|\d+", "", detail).split()[:6]
        node = re.search(r"which is output \d+ of (\S+)", detail)  # whose saved tensor was written
        return cls, stage, " ".join(words) + (" / " + node.group(1) if node else "")
    if cls == "crash":
        m = re.search(r"signal \d+", res.get("detail", ""))
        return cls, stage, m.group(0) if m else ""
    return cls, stage, ""


def walk(stmts: List[gen.Stmt], visible: List[int]):
    """Yields (container, index, stmt, values visible before it)."""
    vis = list(visible)
    for i, s in enumerate(stmts):
        yield stmts, i, s, list(vis)
        for b in s.blocks:
            yield from walk(b, vis + s.inner)
        vis += s.defs


def operands(s: gen.Stmt) -> List[int]:
    ids = []
    for ln in s.lines:
        if isinstance(ln, str):
            ids += [int(m) for m in re.findall(r"\{v(\d+)\}", ln)]
    return ids


def defined_ids(stmts: List[gen.Stmt]) -> dict:
    count = {}
    for _, _, s, _ in walk(stmts, []):
        for d in s.defs:
            count[d] = count.get(d, 0) + 1
    return count


def candidates(p: gen.Program):
    """Yields (description, edited copy) from the most to the least reducing."""
    # outputs and output terms
    if len(p.outputs) > 1:
        for i in range(len(p.outputs)):
            q = copy.deepcopy(p)
            del q.outputs[i]
            yield "drop output %d" % i, q
    for i, terms in enumerate(p.outputs):
        for j in range(len(terms) - 1, 0, -1):
            q = copy.deepcopy(p)
            del q.outputs[i][j]
            yield "drop term %d.%d" % (i, j), q
        if len(terms) > 1:
            q = copy.deepcopy(p)
            q.outputs[i] = terms[:1]
            yield "drop terms of output %d" % i, q
    # statements, last first (later statements depend on earlier ones)
    args = [i for i, n in p.names.items()]
    sites = list(walk(p.body, args))
    ndefs = defined_ids(p.body)
    for k in range(len(sites) - 1, -1, -1):
        container, idx, s, vis = sites[k]
        for alt_i, alt in enumerate(s.alts):
            q = copy.deepcopy(p)
            qs = list(walk(q.body, args))[k]
            qs[0][qs[1] : qs[1] + 1] = copy.deepcopy(alt)
            yield "inline alternative %d of statement %d" % (alt_i, k), q
        if any(ndefs.get(d, 0) > 1 for d in s.defs):
            continue  # a join assignment of an if: deleting one branch's definer breaks the other
        q = copy.deepcopy(p)
        qs = list(walk(q.body, args))[k]
        for d in s.defs:
            shape = p.shapes[d]
            ops = [o for o in operands(s) if o in vis and p.shapes.get(o) == shape and o != d]
            same = [o for o in reversed(vis) if p.shapes.get(o) == shape and o != d]
            repl = (ops or same or [None])[0]
            if repl is not None:  # else: only valid if d is unused (the candidate tells)
                q.subst[d] = repl
        del qs[0][qs[1]]
        yield "delete statement %d" % k, q
    # program knobs
    if p.dtype != "float32":
        q = copy.deepcopy(p)
        q.dtype = "float32"
        yield "dtype float32", q
    if p.mode == "train":
        q = copy.deepcopy(p)
        q.mode = "eval"
        yield "mode eval", q
    fwd = "\n".join(p.forward_lines())
    for i, (name, kind, _) in enumerate(p.args):
        if name != "x" and not re.search(r"\b%s\b" % name, fwd):
            q = copy.deepcopy(p)
            del q.args[i]
            yield "drop argument " + name, q


def renumber(src: str) -> str:
    order = {}
    for m in re.finditer(r"\bv(\d+)\b", src):
        order.setdefault(m.group(1), len(order))
    return re.sub(r"\bv(\d+)\b", lambda m: "v%d" % order[m.group(1)], src)


def shrink(
    p: gen.Program,
    sess: runner.Session,
    log: Callable[[str], None] = lambda s: None,
    max_tries: int = 600,
) -> Tuple[gen.Program, dict]:
    base = sess.run({"id": "shrink-base", "source": p.source()})
    sig = signature(base)
    log("shrink: baseline %s" % (sig,))
    if base["class"] in ("ok", "invalid"):
        return p, base
    best, best_res, tries = p, base, 0
    changed = True
    while changed and tries < max_tries:
        changed = False
        for desc, q in candidates(best):
            tries += 1
            r = sess.run({"id": "shrink-%d" % tries, "source": q.source()})
            if signature(r) == sig:
                best, best_res, changed = q, r, True
                log("shrink: %s -> %d lines" % (desc, len(q.source().splitlines())))
                break
            if tries >= max_tries:
                break
    return best, best_res


def shrink_seed(
    seed: int,
    memslim_opt: str = "",
    cli: Optional[bool] = None,
    jobs: int = 1,
    log: Callable[[str], None] = lambda s: None,
):
    p = gen.generate(seed)
    if cli is None:
        cli = True
    sess = runner.Session(memslim_opt or runner.default_memslim_opt(), cli=cli)
    try:
        first = sess.run({"id": "probe", "source": p.source()})
        if cli and not first.get("stage", "").startswith("cli"):
            sess.close()  # the failure is not memslim-opt's: shrink without that (slower) stage
            sess = runner.Session(memslim_opt or runner.default_memslim_opt(), cli=False)
        best, res = shrink(p, sess, log)
    finally:
        sess.close()
    return best, res


def minimized_source(p: gen.Program) -> str:
    return renumber(p.source())
