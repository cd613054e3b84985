"""The fuzzer's program representation: values, statements and the printed program.

What: `Val` (a generated value's shape and alias facts), `Stmt` (one statement: line
templates, defined values, features, nested blocks, simpler alternatives), `V` (a value's
placeholder) and `Program` (declarations, arguments, body and outputs, printed by
`Program.source()` as a self-contained Python file with `make()`).
Why: the structure the generator (gen.py) builds and the shrinker (shrink.py) edits,
apart from how it is generated.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence


class Val:
    """A value: shape; leafy (aliases an argument: no in-place writes); contig; root
    (the alias group: views, in-place results and plain assignments share it)."""

    __slots__ = ("id", "shape", "leafy", "contig", "root")

    def __init__(
        self, vid: int, shape: Sequence[int], leafy: bool, contig: bool, root: Optional[int] = None
    ):
        self.id, self.shape, self.leafy, self.contig = vid, tuple(shape), leafy, contig
        self.root = vid if root is None else root


class Stmt:
    """One statement. `lines`: templates (`{v<N>}` placeholders, `@I@` for a loop
    index) or ints naming a nested block (indented one level). `defs`: values visible
    after it. `inner`: values visible inside its blocks. `alts`: simpler replacements
    (lists of statements defining the same values), tried by the shrinker."""

    def __init__(self, lines, defs=(), feats=(), blocks=(), alts=(), inner=()):
        self.lines = list(lines)
        self.defs = list(defs)
        self.feats = set(feats)
        self.blocks = [list(b) for b in blocks]
        self.alts = [list(a) for a in alts]
        self.inner = list(inner)
        self.is_loop = any(isinstance(ln, str) and ln.startswith("for ") for ln in self.lines)


def V(v) -> str:
    return "{v%d}" % (v if isinstance(v, int) else v.id)


class Program:
    """A generated module: declarations, forward arguments, statements and outputs."""

    def __init__(self):
        self.seed = 0
        self.dtype = "float32"
        self.mode = "train"
        self.batch = 8
        self.decls: Dict[str, str] = {}  # attribute name -> __init__ line(s)
        self.flags: Dict[str, bool] = {}  # bool constructor args
        self.methods: Dict[str, List[str]] = {}
        self.args: List[tuple] = []  # (name, kind, value): kind tensor/bool/int/float
        self.arg_requires_grad: Dict[str, bool] = {}
        self.body: List[Stmt] = []
        self.outputs: List[List[tuple]] = []  # each: [(vid, "plain"|"sum0"|"sumk"|"mean"|"add")]
        self.tuple_return = False
        self.shapes: Dict[int, tuple] = {}
        self.subst: Dict[int, int] = {}  # shrinker substitutions
        self.names: Dict[int, str] = {}  # argument values (x, y) by id

    # --- emission -------------------------------------------------------
    def resolve(self, vid: int) -> int:
        seen = 0
        while vid in self.subst and seen < 10000:
            vid = self.subst[vid]
            seen += 1
        return vid

    def vname(self, vid: int) -> str:
        vid = self.resolve(vid)
        return self.names.get(vid, "v%d" % vid)

    def _fmt(self, line: str, loop_index: str) -> str:
        line = re.sub(r"\{v(\d+)\}", lambda m: self.vname(int(m.group(1))), line)
        return line.replace("@I@", loop_index)

    def _emit(self, stmts: List[Stmt], indent: int, out: List[str], loop_index: str = "0"):
        # @I@ is the loop index inside a `for` block and 0 outside (an unrolled loop).
        for s in stmts:
            for ln in s.lines:
                if isinstance(ln, int):
                    blk = s.blocks[ln]
                    if blk:
                        self._emit(blk, indent + 1, out, "i" if s.is_loop else loop_index)
                    else:
                        out.append("    " * (indent + 1) + "pass")
                else:
                    out.append("    " * indent + self._fmt(ln, loop_index))

    def output_exprs(self) -> List[str]:
        exprs = []
        for terms in self.outputs:
            parts = []
            for vid, kind in terms:
                n = self.vname(vid)
                parts.append(
                    {
                        "plain": n,
                        "add": n,
                        "sum0": n + ".sum() * 0.0",
                        "sumk": n + ".sum() * 0.1",
                        "mean": n + ".mean()",
                    }[kind]
                )
            exprs.append(" + ".join(parts))
        return exprs

    def forward_lines(self) -> List[str]:
        out: List[str] = []
        self._emit(self.body, 2, out)
        exprs = self.output_exprs()
        if self.tuple_return or len(exprs) > 1:
            ret = ", ".join(exprs) + ("," if len(exprs) == 1 else "")
        else:
            ret = exprs[0]
        out.append("        return " + ret)
        return out

    def source(self) -> str:
        fwd = self.forward_lines()
        used_methods = [m for m in self.methods if re.search(r"self\.%s\(" % m, "\n".join(fwd))]
        text = "\n".join(fwd) + "\n" + "\n".join("\n".join(self.methods[m]) for m in used_methods)
        used = lambda name: re.search(r"self\.%s\b" % re.escape(name), text) is not None
        flags = [f for f in self.flags if used(f)]
        sig = ["self"]
        for name, kind, _ in self.args:
            sig.append(name if kind == "tensor" else "%s: %s" % (name, kind))
        lines = [
            "# memslim differential fuzzer program (test/fuzz/gen.py), seed %d" % self.seed,
            "# features: " + " ".join(sorted(self.features())),
            "import math",
            "",
            "import torch",
            "import torch.nn.functional as F",
            "",
            "",
            "class P(torch.nn.Module):",
            "    def __init__(self%s):" % "".join(", %s: bool" % f for f in flags),
            "        super().__init__()",
        ]
        for f in flags:
            lines.append("        self.%s = %s" % (f, f))
        for name, decl in self.decls.items():
            if used(name):
                lines.append("        " + decl)
        lines += ["", "    def forward(%s):" % ", ".join(sig)] + fwd
        for m in used_methods:
            lines += [""] + self.methods[m]
        dt = "torch." + self.dtype
        ins = []
        for name, kind, value in self.args:
            if kind == "tensor":
                ins.append("torch.randn(%s, dtype=%s)" % (", ".join(map(str, value)), dt))
            else:
                ins.append(repr(value))
        lines += [
            "",
            "",
            "def make():",
            '    """(module, example inputs) for this program; deterministic."""',
            "    torch.manual_seed(%d)" % (self.seed % (2**31)),
            "    m = P(%s).to(%s)" % (", ".join(repr(self.flags[f]) for f in flags), dt),
            "    m.%s()" % self.mode,
            "    return m, (%s%s)" % (", ".join(ins), "," if len(ins) == 1 else ""),
            "",
        ]
        return "\n".join(lines)

    def features(self) -> set:
        f = set()

        def walk(stmts):
            for s in stmts:
                f.update(s.feats)
                for b in s.blocks:
                    walk(b)

        walk(self.body)
        f.add("dtype_" + self.dtype)
        f.add("mode_" + self.mode)
        for name, kind, _ in self.args:
            if kind != "tensor":
                f.add("arg_" + kind)
        if len(self.outputs) > 1 or self.tuple_return:
            f.add("tuple_return")
        if any(k in ("sum0", "sumk", "mean") for t in self.outputs for _, k in t):
            f.add("sum_term")
        return f
