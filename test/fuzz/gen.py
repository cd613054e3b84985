"""Random nn.Module programs for the differential fuzzer (issue 9).

`generate(seed)` builds a `Program`: a structured list of statements over SSA-like
values `v<N>` (each with a known shape) that `Program.source()` prints as a
self-contained Python file: `class P(torch.nn.Module)` plus `make()`, which seeds
torch and returns `(module, example_inputs)`. Every finding is therefore a readable
program that runs on its own. The structure (statements with their defined values,
simpler alternatives for compound statements, outputs as lists of terms) is what
`shrink.py` edits to minimize a finding.

The grammar covers what issue 9 lists: hand-written activations (silu, erf-GELU,
tanh-GELU, mish, hardswish, a FracAct-like formula with a trainable 0-dim order),
aten activations through F.* / torch.* / methods / nn modules (in-place variants
included), linear layers, pointwise chains, addcmul/addcdiv (the ResMLP affine),
in-place writes on intermediates and slices, reused values, ifs on bool attributes /
self.training / bool arguments, dropout, views/reshape/transpose/slicing/cat/chunk,
loops (constant or int-argument trip counts), norms (layer / rms / group / batch,
functional or modules, gamma with zero and tiny channels), helper methods, several outputs and
tuple returns with .sum() terms, bool/int/float arguments, fp32/fp64/bf16, train/eval.
"""

from __future__ import annotations

import random
import re
from typing import Dict, List, Optional, Sequence

WIDTHS = (8, 16, 24)
DTYPES = (("float32", 0.72), ("float64", 0.16), ("bfloat16", 0.12))

# aten activations: (feature, template). `{x}` is the operand.
ACTS = [
    ("gelu", "F.gelu({x})"),
    ("gelu_tanh", "F.gelu({x}, approximate='tanh')"),
    ("silu", "F.silu({x})"),
    ("mish", "F.mish({x})"),
    ("softplus", "F.softplus({x})"),
    ("softplus", "F.softplus({x}, beta=2.0, threshold=5.0)"),
    ("elu", "F.elu({x})"),
    ("elu", "F.elu({x}, alpha=0.5)"),
    ("celu", "F.celu({x}, alpha=1.5)"),
    ("selu", "F.selu({x})"),
    ("leaky_relu", "F.leaky_relu({x}, 0.2)"),
    ("hardswish", "F.hardswish({x})"),
    ("hardsigmoid", "F.hardsigmoid({x})"),
    ("sigmoid", "torch.sigmoid({x})"),
    ("sigmoid", "{x}.sigmoid()"),
    ("tanh", "torch.tanh({x})"),
    ("relu", "F.relu({x})"),
    ("relu", "torch.relu({x})"),
    ("relu", "{x}.relu()"),
    ("relu6", "F.relu6({x})"),
]
# In-place activations: (feature, template, is_statement_form).
INPLACE_ACTS = [
    ("silu_", "F.silu({x}, inplace=True)"),
    ("relu_", "F.relu({x}, inplace=True)"),
    ("relu_", "{x}.relu_()"),
    ("relu_", "torch.relu_({x})"),
    ("sigmoid_", "torch.sigmoid_({x})"),
    ("sigmoid_", "{x}.sigmoid_()"),
    ("tanh_", "torch.tanh_({x})"),
    ("tanh_", "{x}.tanh_()"),
    ("elu_", "F.elu({x}, inplace=True)"),
    ("celu_", "F.celu({x}, alpha=0.5, inplace=True)"),
    ("selu_", "F.selu({x}, inplace=True)"),
    ("leaky_relu_", "F.leaky_relu({x}, 0.1, inplace=True)"),
    ("hardswish_", "F.hardswish({x}, inplace=True)"),
    ("hardsigmoid_", "F.hardsigmoid({x}, inplace=True)"),
    ("mish_", "F.mish({x}, inplace=True)"),
    ("relu6_", "F.relu6({x}, inplace=True)"),
]
MODULE_ACTS = [
    ("gelu", "torch.nn.GELU()", False),
    ("gelu_tanh", "torch.nn.GELU(approximate='tanh')", False),
    ("silu", "torch.nn.SiLU()", False),
    ("silu_", "torch.nn.SiLU(inplace=True)", True),
    ("relu_", "torch.nn.ReLU(inplace=True)", True),
    ("mish", "torch.nn.Mish()", False),
    ("hardswish", "torch.nn.Hardswish()", False),
    ("leaky_relu_", "torch.nn.LeakyReLU(0.1, inplace=True)", True),
    ("elu", "torch.nn.ELU()", False),
    ("sigmoid", "torch.nn.Sigmoid()", False),
    ("tanh", "torch.nn.Tanh()", False),
    ("softplus", "torch.nn.Softplus()", False),
]
# Hand-written activations (one expression in {x}).
HAND = [
    ("hand_silu", "{x} * torch.sigmoid({x})"),
    ("hand_silu", "torch.sigmoid({x}) * {x}"),
    ("hand_silu", "{x} / (1.0 + torch.exp(-{x}))"),
    ("hand_gelu", "0.5 * {x} * (1.0 + torch.erf({x} / math.sqrt(2.0)))"),
    ("hand_gelu", "{x} * 0.5 * (1.0 + torch.erf({x} * 0.7071067811865476))"),
    ("hand_gelu", "{x} * (torch.erf({x} / 1.4142135623730951) + 1.0) * 0.5"),
    (
        "hand_gelu_tanh",
        "0.5 * {x} * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * ({x} + 0.044715 * torch.pow({x}, 3.0))))",
    ),
    (
        "hand_gelu_tanh",
        "0.5 * {x} * (1.0 + torch.tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))",
    ),
    ("hand_mish", "{x} * torch.tanh(F.softplus({x}))"),
    ("hand_mish", "torch.tanh(F.softplus({x})) * {x}"),
    ("hand_hardswish", "{x} * F.relu6({x} + 3.0) / 6.0"),
    ("hand_hardswish", "{x} * torch.clamp({x} + 3.0, 0.0, 6.0) / 6.0"),
    ("hand_hardswish", "{x} * (F.relu6({x} + 3.0) / 6.0)"),
    ("hand_hardswish", "{x} * F.hardsigmoid({x})"),
    ("hand_quick_gelu", "{x} * torch.sigmoid(1.702 * {x})"),
]
# Pointwise ops: (template, saves its operand(s) for backward, saves its output).
UNARY = [
    ("torch.tanh({x})", 0, 1),
    ("torch.exp(-{x}.abs())", 1, 0),
    ("{x}.abs()", 1, 0),
    ("-{x}", 0, 0),
    ("{x} * {x}", 1, 0),
    ("torch.sqrt({x}.abs() + 1.0)", 1, 0),
    ("torch.log1p({x}.abs())", 1, 0),
    ("torch.clamp({x}, -2.0, 2.0)", 1, 0),
    ("{x}.pow(2)", 1, 0),
    ("torch.sin({x})", 1, 0),
    ("torch.cos({x})", 1, 0),
    ("torch.rsqrt({x} * {x} + 1.0)", 1, 0),
    ("torch.where({x} > 0, {x}, {x} * 0.1)", 1, 0),
    ("{x} * 1.5", 0, 0),
    ("{x} + 0.5", 0, 0),
    ("1.0 - {x}", 0, 0),
    ("{x} / 2.0", 0, 0),
    ("torch.erf({x})", 1, 0),
    ("torch.exp({x}.clamp(max=3.0))", 1, 1),
    ("{x} * 2.0 - 1.0", 0, 0),
]
BINARY = [
    ("{x} + {y}", 0),
    ("{x} - {y}", 0),
    ("{x} * {y}", 1),
    ("{x} / ({y}.abs() + 1.0)", 1),
    ("torch.maximum({x}, {y})", 1),
    ("torch.where({x} > {y}, {x}, {y} * 0.5)", 1),
    ("{x} * 0.5 + {y} * 0.25", 0),
    ("{x} * torch.sigmoid({y})", 1),
]
OUTPUT_SAVERS = {"sigmoid", "tanh", "relu"}  # aten activations whose backward reads their output
INPLACE_WRITES = [
    "{x}.add_(1.0)",
    "{x}.mul_(2.0)",
    "{x}.mul_(0.5)",
    "{x}.sub_(0.25)",
    "{x}.div_(2.0)",
    "{x}.clamp_(-3.0, 3.0)",
    "{x}.masked_fill_({x} > 2.0, 2.0)",
]
INPLACE_SLICE_WRITES = [
    "{x}[:, :{k}].add_(1.0)",
    "{x}[:, :{k}].mul_(2.0)",
    "{x}[:, {k}:].mul_(0.5)",
    "F.relu({x}[:, :{k}], inplace=True)",
    "{x}[0].add_(1.0)",
]
INPLACE_BINARY_WRITES = [
    "{x}.add_({y})",
    "{x}.add_({y}, alpha=0.5)",
    "{x}.mul_({y})",
    "{x}.copy_({y})",
    "{x}.addcmul_({y}, {y}, value=0.1)",
]


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


class Gen:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.p = Program()
        self.p.seed = seed
        self.vals: Dict[int, Val] = {}
        self.pool: List[int] = []
        self.next_id = 0
        self.counters: Dict[str, int] = {}
        self.uses: Dict[int, int] = {}
        self.depth = 0
        self.in_loop = False
        self.loop_start = 0
        self.saved = set()  # alias roots autograd has saved (writing them breaks backward)

    # --- helpers --------------------------------------------------------
    def name(self, prefix: str) -> str:
        n = self.counters.get(prefix, 0)
        self.counters[prefix] = n + 1
        return "%s%d" % (prefix, n)

    def new(self, shape, leafy=False, contig=True, alias: Optional[Val] = None) -> Val:
        if alias is not None:
            leafy = leafy or alias.leafy
        v = Val(self.next_id, shape, leafy, contig, None if alias is None else alias.root)
        self.next_id += 1
        self.vals[v.id] = v
        self.p.shapes[v.id] = v.shape
        self.pool.append(v.id)
        return v

    def pick(self, pred=None) -> Optional[Val]:
        cands = [i for i in self.pool if pred is None or pred(self.vals[i])]
        if not cands:
            return None
        k = min(int(self.rng.expovariate(0.45)), len(cands) - 1)
        v = self.vals[cands[len(cands) - 1 - k]]
        self.uses[v.id] = self.uses.get(v.id, 0) + 1
        return v

    def partner(self, v: Val) -> Optional[Val]:
        return self.pick(lambda u: u.shape == v.shape)

    def param(self, shape, kind="weight", reuse=0.35) -> str:
        shape = tuple(shape)
        existing = [n for n, s in getattr(self, "_params", {}).items() if s == shape]
        if existing and self.rng.random() < reuse:
            return self.rng.choice(existing)
        self._params = getattr(self, "_params", {})
        if kind == "weight":
            n = self.name("w")
            init = "torch.randn(%d, %d) * %.4f" % (shape[0], shape[1], 1.0 / shape[1] ** 0.5)
        elif kind == "bias":
            n = self.name("b")
            init = "torch.randn(%d) * 0.1" % shape[0]
        elif kind == "scale":
            n = self.name("g")
            init = "1.0 + torch.randn(%d) * 0.1" % shape[0]
        elif kind == "edge_scale":  # a norm's gamma with zero and tiny channels
            n = self.name("g")
            init = "torch.where(torch.rand({0}) < 0.3, torch.zeros({0}), torch.randn({0}) * 0.05)".format(
                shape[0]
            )
        else:  # 0-dim
            n = self.name("s")
            init = "torch.tensor(%.2f)" % self.rng.uniform(0.2, 1.2)
        self._params[n] = shape
        self.p.decls[n] = "self.%s = torch.nn.Parameter(%s)" % (n, init)
        return n

    def flag(self) -> str:
        existing = list(self.p.flags)
        if existing and self.rng.random() < 0.4:
            return self.rng.choice(existing)
        n = self.name("flag")
        self.p.flags[n] = self.rng.random() < 0.6
        return n

    def arg(self, kind: str) -> Optional[str]:
        for name, k, _ in self.p.args:
            if k == kind:
                return name
        return None

    def inter(self, v: Val) -> bool:
        """May be written in place: not an argument's alias, not saved for backward
        (5% of the time the saved check is skipped: eager then rejects most of them),
        and inside a loop body only values of the current iteration."""
        if v.leafy:
            return False
        if self.in_loop and (v.id < self.loop_start or v.root < self.loop_start):
            return False
        return v.root not in self.saved or self.rng.random() < 0.05

    def save(self, *vals):
        for v in vals:
            if v is not None:
                self.saved.add(v.root)

    # --- statement generators: each returns a list of Stmt ----------------
    def s_linear(self):
        v = self.pick()
        cin, cout = v.shape[-1], self.rng.choice(WIDTHS)
        if self.in_loop:
            cout = cin
        self.save(v)
        r = self.new(v.shape[:-1] + (cout,))
        style = self.rng.random()
        if style < 0.55:
            w = self.param((cout, cin))
            if self.rng.random() < 0.4:
                b = self.param((cout,), "bias")
                line = "%s = F.linear(%s, self.%s, self.%s)" % (V(r), V(v), w, b)
            else:
                line = "%s = F.linear(%s, self.%s)" % (V(r), V(v), w)
            feat = "linear"
        elif style < 0.75:
            n = self.name("lin")
            self.p.decls[n] = "self.%s = torch.nn.Linear(%d, %d, bias=%s)" % (
                n,
                cin,
                cout,
                self.rng.random() < 0.6,
            )
            line = "%s = self.%s(%s)" % (V(r), n, V(v))
            feat = "nn_linear"
        else:
            w = self.param((cout, cin))
            line = self.rng.choice(
                ["%s = torch.matmul(%s, self.%s.t())", "%s = %s @ self.%s.t()"]
            ) % (V(r), V(v), w)
            feat = "matmul"
        return [Stmt([line], [r.id], [feat])]

    def act_saves(self, feat: str, v: Val, r: Val):
        if feat.rstrip("_") in OUTPUT_SAVERS:
            self.save(r)
        else:
            self.save(v)

    def s_act(self):
        roll = self.rng.random()
        if roll < 0.25:
            v = self.pick(self.inter)
            if v is not None:
                feat, t = self.rng.choice(INPLACE_ACTS)
                expr = t.format(x=V(v))
                self.save(v)
                if self.rng.random() < 0.4:
                    return [Stmt([expr], [], ["act_inplace", "act:" + feat])]
                r = self.new(v.shape, contig=v.contig, alias=v)
                return [Stmt(["%s = %s" % (V(r), expr)], [r.id], ["act_inplace", "act:" + feat])]
        if roll < 0.38:
            feat, ctor, inplace = self.rng.choice(MODULE_ACTS)
            v = self.pick(self.inter) if inplace else self.pick()
            if v is None:
                return []
            n = self.name("act")
            self.p.decls[n] = "self.%s = %s" % (n, ctor)
            r = self.new(v.shape, contig=v.contig or not inplace, alias=v if inplace else None)
            self.act_saves(feat, v, r)
            return [
                Stmt(["%s = self.%s(%s)" % (V(r), n, V(v))], [r.id], ["act_module", "act:" + feat])
            ]
        v = self.pick()
        feat, t = self.rng.choice(ACTS)
        r = self.new(v.shape)
        self.act_saves(feat, v, r)
        return [Stmt(["%s = %s" % (V(r), t.format(x=V(v)))], [r.id], ["act:" + feat])]

    def s_hand(self):
        v = self.pick()
        roll = self.rng.random()
        if roll < 0.12 and not self.in_loop:
            return self.s_fracact(v)
        if roll < 0.4:
            return self.s_split_hand(v)
        feat, t = self.rng.choice(HAND)
        r = self.new(v.shape)
        self.save(v)
        return [Stmt(["%s = %s" % (V(r), t.format(x=V(v)))], [r.id], [feat])]

    def s_split_hand(self, h: Val):
        """A hand-written activation spread over statements, optionally with an
        in-place write on its input in between (issue 9's silu mis-rewrite)."""
        out = []
        kind = self.rng.choice(["silu", "gelu", "mish"])
        s = self.new(h.shape)
        if kind == "silu":
            out.append(Stmt(["%s = torch.sigmoid(%s)" % (V(s), V(h))], [s.id], ["hand_split"]))
            self.save(s)
        elif kind == "gelu":
            out.append(
                Stmt(
                    ["%s = 1.0 + torch.erf(%s * 0.7071067811865476)" % (V(s), V(h))],
                    [s.id],
                    ["hand_split"],
                )
            )
            self.save(h)
        else:
            out.append(
                Stmt(["%s = torch.tanh(F.softplus(%s))" % (V(s), V(h))], [s.id], ["hand_split"])
            )
            self.save(h, s)
        if self.inter(h) and self.rng.random() < 0.6:
            out.append(
                Stmt(
                    [self.rng.choice(INPLACE_WRITES).format(x=V(h))],
                    [],
                    ["inplace_write", "write_between"],
                )
            )
        r = self.new(h.shape)
        expr = {"silu": "%s * %s", "gelu": "0.5 * %s * %s", "mish": "%s * %s"}[kind] % (V(h), V(s))
        self.save(h, s)
        out.append(Stmt(["%s = %s" % (V(r), expr)], [r.id], ["hand_split", "hand_" + kind]))
        return out

    def s_fracact(self, x: Val):
        order = self.param((), "zero_dim", reuse=0.3)
        t = "t%d_" % self.next_id
        use_buf = self.rng.random() < 0.5
        lines = [
            "{t}a = torch.sigmoid(self.{o}) * 1.8 + 0.1",
            "{t}p = torch.where({x} > 0, {x}, 1.0)",
            "{t}p = 1.0507 * torch.pow({t}p, 1 - {t}a) / torch.exp(torch.lgamma(2 - {t}a))",
            "{t}q = torch.where({x} <= 0, {x}, 1.0)",
            "{t}g = torch.exp(torch.lgamma(1 + {t}a))",
        ]
        if use_buf:
            bn = self.name("consts")
            self.p.decls[bn] = (
                'self.register_buffer("%s", torch.tensor([0.0, 1.0, 2.0]), persistent=False)' % bn
            )
            lines += [
                "{t}n = self.%s[1]" % bn,
                "{t}acc = (1 - torch.exp({t}q)) * {t}g / torch.exp(torch.lgamma(1 + {t}a))",
                "{t}acc = {t}acc + (1 - torch.exp({t}q - {t}n)) * {t}g / torch.exp(torch.lgamma({t}a)) * torch.pow(-1, {t}n)",
            ]
        else:
            lines += [
                "{t}acc = (1 - torch.exp({t}q)) * {t}g / torch.exp(torch.lgamma(1 + {t}a))",
                "{t}acc = {t}acc - (1 - torch.exp({t}q - 1.0)) * {t}g / torch.exp(torch.lgamma({t}a))",
            ]
        r = self.new(x.shape)
        self.save(x)
        lines.append("{r} = torch.where({x} > 0, {t}p, 1.7581 / torch.pow(1.0, {t}a) * {t}acc)")
        lines = [
            ln.replace("{t}", t).replace("{o}", order).replace("{x}", V(x)).replace("{r}", V(r))
            for ln in lines
        ]
        return [Stmt(lines, [r.id], ["fracact"])]

    def s_pointwise(self):
        v = self.pick()
        roll = self.rng.random()
        if roll < 0.35:
            t, si, so = self.rng.choice(UNARY)
            expr, feat = t.format(x=V(v)), "pw_unary"
            r = self.new(v.shape)
            if si:
                self.save(v)
            if so:
                self.save(r)
            return [Stmt(["%s = %s" % (V(r), expr)], [r.id], [feat])]
        if roll < 0.65:
            y = self.partner(v)
            t, sv = self.rng.choice(BINARY)
            expr, feat = t.format(x=V(v), y=V(y)), "pw_binary"
            if sv:
                self.save(v, y)
        elif roll < 0.8:
            y, z = self.partner(v), self.partner(v)
            self.save(y, z)
            if self.rng.random() < 0.5:
                expr, feat = "torch.addcmul(%s, %s, %s, value=0.5)" % (V(v), V(y), V(z)), "addcmul"
            else:
                expr, feat = (
                    "torch.addcdiv(%s, %s, %s.abs() + 1.0, value=0.3)" % (V(v), V(y), V(z)),
                    "addcdiv",
                )
        elif roll < 0.92:
            c = v.shape[-1]
            k = self.rng.random()
            if k < 0.4:  # ResMLP's Affine: addcmul(beta, alpha, x)
                a, b = self.param((c,), "scale", 0.2), self.param((c,), "bias", 0.2)
                expr, feat = "torch.addcmul(self.%s, self.%s, %s)" % (b, a, V(v)), "affine_addcmul"
                self.save(v)
            elif k < 0.7:
                a = self.param((c,), "scale", 0.3)
                expr, feat = "%s * self.%s" % (V(v), a), "param_broadcast"
                self.save(v)
            else:
                s = self.param((), "zero_dim", 0.3)
                if self.rng.random() < 0.5:
                    expr = "%s * self.%s" % (V(v), s)
                    self.save(v)
                else:
                    expr = "%s + torch.sigmoid(self.%s)" % (V(v), s)
                feat = "param_0dim"
        else:
            s, k = self.arg("float"), self.arg("int")
            if s is not None and (k is None or self.rng.random() < 0.5):
                expr, feat = "%s * %s + %s" % (V(v), s, s), "use_arg_float"
            elif k is not None:
                expr, feat = "%s * %s" % (V(v), k), "use_arg_int"
            else:
                expr, feat = "%s * %s" % (V(v), V(v)), "pw_binary"
                self.save(v)
        r = self.new(v.shape)
        return [Stmt(["%s = %s" % (V(r), expr)], [r.id], [feat])]

    def s_inplace(self):
        v = self.pick(self.inter)
        if v is None:
            return []
        roll = self.rng.random()
        if roll < 0.4:
            line, feat = self.rng.choice(INPLACE_WRITES).format(x=V(v)), "inplace_write"
            if "clamp_" in line:
                self.save(v)
        elif roll < 0.75 and len(v.shape) == 2 and v.shape[1] > 2:
            k = self.rng.randint(1, v.shape[1] - 1)
            t = self.rng.choice(INPLACE_SLICE_WRITES)
            if self.rng.random() < 0.3:
                y = self.partner(v)
                line = "{x}[:, :{k}] = {y}[:, :{k}]".format(x=V(v), y=V(y), k=k)
            else:
                line = t.format(x=V(v), k=k)
                if "relu" in line:
                    self.save(v)
            feat = "inplace_slice"
        else:
            y = self.partner(v)
            t = self.rng.choice(INPLACE_BINARY_WRITES)
            line, feat = t.format(x=V(v), y=V(y)), "inplace_write"
            if "mul_" in t:
                self.save(v, y)
        return [Stmt([line], [], [feat])]

    def s_view(self):
        v = self.pick()
        sh = v.shape
        numel = 1
        for d in sh:
            numel *= d
        roll = self.rng.random()
        if len(sh) == 2 and roll < 0.2:
            r = self.new((sh[1], sh[0]), contig=False, alias=v)
            expr = self.rng.choice(["%s.t()", "%s.transpose(0, 1)"]) % V(v)
            return [Stmt(["%s = %s" % (V(r), expr)], [r.id], ["view_transpose"])]
        if len(sh) == 2 and sh[1] > 2 and roll < 0.4:
            k = self.rng.randint(1, sh[1] - 1)
            if self.rng.random() < 0.5:
                r = self.new((sh[0], k), contig=False, alias=v)
                expr = self.rng.choice(
                    ["%s[:, :%d]" % (V(v), k), "%s.narrow(1, 0, %d)" % (V(v), k)]
                )
            else:
                r = self.new((sh[0], sh[1] - k), contig=False, alias=v)
                expr = "%s[:, %d:]" % (V(v), k)
            return [Stmt(["%s = %s" % (V(r), expr)], [r.id], ["view_slice"])]
        if len(sh) == 2 and sh[1] % 2 == 0 and roll < 0.5:
            a = self.new((sh[0], sh[1] // 2), contig=False, alias=v)
            b = self.new((sh[0], sh[1] // 2), contig=False, alias=v)
            return [
                Stmt(
                    ["%s, %s = %s.chunk(2, dim=1)" % (V(a), V(b), V(v))],
                    [a.id, b.id],
                    ["view_chunk"],
                )
            ]
        if roll < 0.7:
            m = self.rng.choice([d for d in (2, 4, 8) if numel % d == 0] or [1])
            if self.rng.random() < 0.5 and len(sh) == 2:
                # reshape round trip with an activation in between
                t = self.new((numel // m, m), contig=v.contig, alias=v)
                feat, tmpl = self.rng.choice(ACTS + HAND)
                u = self.new((numel // m, m))
                self.act_saves(feat, t, u)
                r = self.new(sh, alias=u)
                lines = [
                    "%s = %s.reshape(%d, %d)" % (V(t), V(v), numel // m, m),
                    "%s = %s" % (V(u), tmpl.format(x=V(t))),
                    "%s = %s.reshape(%s)" % (V(r), V(u), ", ".join(map(str, sh))),
                ]
                feat = feat if feat.startswith("hand") else "act:" + feat
                return [
                    Stmt(lines[:1], [t.id], ["view_reshape"]),
                    Stmt(lines[1:2], [u.id], [feat]),
                    Stmt(lines[2:], [r.id], ["view_reshape"]),
                ]
            use_view = v.contig and self.rng.random() < 0.5
            r = self.new((numel // m, m), contig=v.contig, alias=v)
            expr = "%s.%s(%d, %d)" % (V(v), "view" if use_view else "reshape", numel // m, m)
            return [Stmt(["%s = %s" % (V(r), expr)], [r.id], ["view_reshape"])]
        if roll < 0.85:
            y = self.pick(lambda u: len(u.shape) == len(sh) and u.shape[:-1] == sh[:-1])
            r = self.new(sh[:-1] + (sh[-1] + y.shape[-1],))
            return [
                Stmt(
                    ["%s = torch.cat([%s, %s], dim=%d)" % (V(r), V(v), V(y), len(sh) - 1)],
                    [r.id],
                    ["cat"],
                )
            ]
        if len(sh) == 2 and roll < 0.92:
            t = self.new((1,) + sh, contig=v.contig, alias=v)
            r = self.new(sh, contig=v.contig, alias=v)
            return [
                Stmt(["%s = %s.unsqueeze(0)" % (V(t), V(v))], [t.id], ["view_unsqueeze"]),
                Stmt(["%s = %s.squeeze(0)" % (V(r), V(t))], [r.id], ["view_unsqueeze"]),
            ]
        r = self.new(sh)
        return [Stmt(["%s = %s.contiguous() * 1.0" % (V(r), V(v))], [r.id], ["contiguous"])]

    def s_norm(self):
        """A norm (layer / rms / group / batch; functional or module; affine on or
        off; gamma sometimes with zero and tiny channels, the output-saving norms'
        fallback). Aten's norm keeps its input."""
        v = self.pick(lambda u: len(u.shape) >= 2)
        if v is None:
            return []
        last, chan = v.shape[-1], v.shape[1]
        pre = []
        tail = self.rng.random() < 0.4
        if tail and self.rng.random() < 0.6:
            # A fresh input, as a conv's output in a ResNet block: only the norm keeps it.
            h = self.new(v.shape)
            pre.append("%s = F.linear(%s, self.%s)" % (V(h), V(v), self.param((last, last))))
            self.save(v)
            v = h
        r = self.new(v.shape)
        self.save(v)
        kind = self.rng.choice(["layer", "layer", "rms", "group", "batch", "hand"])
        gamma = "scale" if self.rng.random() < 0.7 else "edge_scale"
        affine = self.rng.random() < 0.8
        if kind == "hand":
            line = self.hand_norm(v, r, gamma, affine)
        elif kind == "layer":
            if self.rng.random() < 0.35:
                n = self.name("norm")
                extra = "" if affine else ", elementwise_affine=False"
                if affine and self.rng.random() < 0.3:
                    extra = ", bias=False"
                self.p.decls[n] = "self.%s = torch.nn.LayerNorm(%d%s)" % (n, last, extra)
                line = "%s = self.%s(%s)" % (V(r), n, V(v))
            else:
                args = ""
                if affine:
                    args = ", self.%s, self.%s" % (
                        self.param((last,), gamma),
                        self.param((last,), "bias"),
                    )
                line = "%s = F.layer_norm(%s, (%d,)%s)" % (V(r), V(v), last, args)
        elif kind == "rms":
            if self.rng.random() < 0.35:
                n = self.name("norm")
                self.p.decls[n] = "self.%s = torch.nn.RMSNorm(%d, eps=1e-6)" % (n, last)
                line = "%s = self.%s(%s)" % (V(r), n, V(v))
            else:
                w = ", self.%s" % self.param((last,), gamma) if affine else ""
                line = "%s = F.rms_norm(%s, (%d,)%s, eps=1e-6)" % (V(r), V(v), last, w)
        elif kind == "group":
            groups = self.rng.choice([g for g in (1, 2, 4) if chan % g == 0])
            args = ""
            if affine:
                args = ", self.%s, self.%s" % (
                    self.param((chan,), gamma),
                    self.param((chan,), "bias"),
                )
            line = "%s = F.group_norm(%s, %d%s)" % (V(r), V(v), groups, args)
        elif self.rng.random() < 0.4:
            n = self.name("norm")
            self.p.decls[n] = "self.%s = torch.nn.BatchNorm1d(%d, affine=%s)" % (n, chan, affine)
            line = "%s = self.%s(%s)" % (V(r), n, V(v))
        else:
            rm, rv = self.name("rm"), self.name("rv")
            self.p.decls[rm] = "self.%s = torch.nn.Buffer(torch.randn(%d) * 0.1)" % (rm, chan)
            self.p.decls[rv] = "self.%s = torch.nn.Buffer(torch.rand(%d) + 0.5)" % (rv, chan)
            args = ""
            if affine:
                args = ", self.%s, self.%s" % (
                    self.param((chan,), gamma),
                    self.param((chan,), "bias"),
                )
            line = "%s = F.batch_norm(%s, self.%s, self.%s%s, training=self.training)" % (
                V(r),
                V(v),
                rm,
                rv,
                args,
            )
        stmts = [Stmt(pre + [line], [r.id] + ([v.id] if pre else []), ["norm", "norm:" + kind])]
        if tail:
            stmts += self.residual_tail(r)
        return stmts

    def hand_norm(self, v, r, gamma, affine) -> str:
        """A norm over the last dim written out by hand (canonicalize-norms' patterns and
        near misses): BertLayerNorm's (x - u) / sqrt(s + eps), the rsqrt form, s by
        mean of squares or var(unbiased=False), x.var()'s unbiased default (no layer
        norm: must stay), LlamaRMSNorm; eps a literal or a module float attribute;
        weight and bias each optional, in either operand order."""
        x, last = V(v), v.shape[-1]
        eps = self.rng.choice(["1e-5", "1e-12", "1e-6"])
        if self.rng.random() < 0.4:
            n = self.name("eps")
            self.p.decls[n] = "self.%s = %s" % (n, eps)
            eps = "self." + n
        form = self.rng.choice(["pow", "mul", "var", "var_unbiased", "rms"])
        if form == "rms":
            core = "(%s * torch.rsqrt(%s.pow(2).mean(-1, keepdim=True) + %s))" % (x, x, eps)
        else:
            u = "%s.mean(-1, keepdim=True)" % x
            s = {
                "pow": "(%s - %s).pow(2).mean(-1, keepdim=True)" % (x, u),
                "mul": "((%s - %s) * (%s - %s)).mean(-1, keepdim=True)" % (x, u, x, u),
                "var": "%s.var(-1, keepdim=True, unbiased=False)" % x,
                "var_unbiased": "%s.var(-1, keepdim=True)" % x,
            }[form]
            if self.rng.random() < 0.5:
                core = "((%s - %s) / torch.sqrt(%s + %s))" % (x, u, s, eps)
            else:
                core = "((%s - %s) * torch.rsqrt(%s + %s))" % (x, u, s, eps)
        expr = core
        if affine:
            w = "self.%s" % self.param((last,), gamma)
            expr = "%s * %s" % ((w, core) if self.rng.random() < 0.5 else (core, w))
        if affine and form != "rms" and self.rng.random() < 0.7:
            b = "self.%s" % self.param((last,), "bias")
            expr = "%s + %s" % ((expr, b) if self.rng.random() < 0.5 else (b, expr))
        return "%s = %s" % (V(r), expr)

    def residual_tail(self, y):
        """A residual join after a norm (fuse-residual-join's pattern): y + r, r + y or
        ResNet's in-place `y += r`, r sometimes an activation of another value made for
        the add, the sum sometimes through relu (in place or not)."""
        u = self.partner(y)
        if u is None or u.id == y.id:
            return []
        lines, made, feats = [], [], ["residual_join"]
        src = u
        if self.rng.random() < 0.5:
            feat, t = self.rng.choice([("relu", "torch.relu({x})")] + ACTS[:13])
            a = self.new(u.shape)
            self.act_saves(feat, u, a)
            lines.append("%s = %s" % (V(a), t.format(x=V(u))))
            made.append(a.id)
            src = a
        roll = self.rng.random()
        if roll < 0.4 and self.inter(y):
            lines.append("%s += %s" % (V(y), V(src)))
            s = y
        else:
            s = self.new(y.shape)
            expr = "%s + %s" % ((V(y), V(src)) if roll < 0.7 else (V(src), V(y)))
            lines.append("%s = %s" % (V(s), expr))
            made.append(s.id)
        if self.rng.random() < 0.5:
            if self.rng.random() < 0.5 and self.inter(s):
                lines.append("F.relu(%s, inplace=True)" % V(s))
                self.save(s)
            else:
                o = self.new(s.shape)
                lines.append("%s = torch.relu(%s)" % (V(o), V(s)))
                self.save(o)
                made.append(o.id)
        # Keepers of the sum and of the residual (what makes the join pay: in a
        # ResNet the next block's conv keeps both).
        last = y.shape[-1]
        for src_v, prob in ((s, 0.6), (u, 0.4)):
            if self.rng.random() < prob:
                k = self.new(tuple(src_v.shape[:-1]) + (last,))
                lines.append(
                    "%s = F.linear(%s, self.%s)" % (V(k), V(src_v), self.param((last, last)))
                )
                self.save(src_v)
                made.append(k.id)
        return [Stmt(lines, made, feats)]

    def coupling_fn(self, inp: "Val", lines: list, feats: list, escape: list) -> "Val":
        """F or G of a coupling on `inp` (its own width): one of a few layer templates,
        sometimes with a BatchNorm1d (running stats), a dropout (random numbers) or a
        large gain (drift in the rebuilt input). Its intermediates stay out of the pool
        unless `escape` asks (then invertible-couplings must keep the coupling)."""
        rng = self.rng
        h = inp.shape[-1]
        t = self.new(inp.shape)
        self.pool.remove(t.id)
        w = self.param((h, h))
        roll = rng.random()
        if roll < 0.3:
            lines.append("%s = F.linear(%s, self.%s)" % (V(t), V(inp), w))
        elif roll < 0.5:
            n = self.name("bn")
            self.p.decls[n] = "self.%s = torch.nn.BatchNorm1d(%d)" % (n, h)
            lines.append("%s = F.linear(self.%s(%s), self.%s)" % (V(t), n, V(inp), w))
            feats.append("coupling_bn")
        elif roll < 0.7:
            lines.append(
                "%s = %s * torch.sigmoid(F.linear(%s, self.%s))" % (V(t), V(inp), V(inp), w)
            )
        else:
            lines.append("%s = F.linear(F.layer_norm(%s, (%d,)), self.%s)" % (V(t), V(inp), h, w))
        if escape and rng.random() < 0.5:
            self.pool.append(t.id)  # another reader may pick it: no coupling then
            escape.clear()
        out = self.new(inp.shape)
        self.pool.remove(out.id)
        feat, tmpl = rng.choice(ACTS)
        expr = tmpl.format(x=V(t))
        if rng.random() < 0.25:
            expr = "F.dropout(%s, p=0.25, training=self.training)" % expr
            feats.append("coupling_dropout")
        if rng.random() < 0.05:
            # A gain: x1 = y1 - F(x2) then cancels a few digits (the drift check's
            # case). Larger gains made every rounding change of other passes look
            # wrong to the judge (seed 701039: canonicalize-activations' silu under
            # two 1000x gains and a BatchNorm: 2.5e-4 where eager's own fp32 error
            # was 1.7e-5).
            expr = "(%s) * 30.0" % expr
            feats.append("coupling_gain")
        lines.append("%s = %s" % (V(out), expr))
        self.save(inp, t, out)
        return out

    def s_coupling(self):
        """Couplings y1 = x1 + F(x2), y2 = x2 + G(y1) over the halves of the last dim,
        some halves affine (x * exp(tanh(f)) + tanh(f), (x + f) * sigmoid(f + 2)), 1-3
        blocks linked directly or through cat / chunk (issue 12)."""
        rng = self.rng
        if self.in_loop:
            return []
        v = self.pick(lambda u: len(u.shape) == 2 and u.shape[-1] % 2 == 0)
        if v is None:
            return []
        half = v.shape[:-1] + (v.shape[-1] // 2,)
        lines, feats = [], ["coupling"]
        x1, x2 = self.new(half, alias=v), self.new(half, alias=v)
        lines.append("%s, %s = torch.chunk(%s, 2, dim=-1)" % (V(x1), V(x2), V(v)))
        blocks = rng.randint(1, 3)
        made = [x1.id, x2.id]
        # Affine halves from a stream of their own: a seed that drew no affine half
        # generates the program it generated before they existed.
        forms = random.Random(self.p.seed * 104729 + 5)

        def combine(y, x, f):
            roll = forms.random()
            if roll < 0.15:  # RealNVP: x * exp(tanh(f)) + tanh(f)
                lines.append(
                    "%s = %s * torch.exp(torch.tanh(%s)) + torch.tanh(%s)"
                    % (V(y), V(x), V(f), V(f))
                )
                feats.append("coupling_affine")
            elif roll < 0.3:  # Glow: (x + f) * sigmoid(f + 2)
                lines.append("%s = (%s + %s) * torch.sigmoid(%s + 2.0)" % (V(y), V(x), V(f), V(f)))
                feats.append("coupling_affine")
            else:
                lines.append("%s = %s + %s" % (V(y), V(x), V(f)))

        for b in range(blocks):
            escape = [True] if rng.random() < 0.1 else []
            f = self.coupling_fn(x2, lines, feats, escape)
            y1 = self.new(half)
            combine(y1, x1, f)
            g = self.coupling_fn(y1, lines, feats, escape)
            y2 = self.new(half)
            combine(y2, x2, g)
            made += [y1.id, y2.id]
            if b + 1 < blocks:
                if rng.random() < 0.6:
                    c = self.new(v.shape)
                    x1, x2 = self.new(half, alias=c), self.new(half, alias=c)
                    lines.append("%s = torch.cat([%s, %s], dim=-1)" % (V(c), V(y1), V(y2)))
                    lines.append("%s, %s = torch.chunk(%s, 2, dim=-1)" % (V(x1), V(x2), V(c)))
                    made += [c.id, x1.id, x2.id]
                else:
                    x1, x2 = y1, y2
        out = self.new(v.shape)
        lines.append("%s = torch.cat([%s, %s], dim=-1)" % (V(out), V(y1), V(y2)))
        # The blocks' values stay out of the pool but for the result (and, rarely, one
        # inner value another statement may read: the chain must then end there).
        keep = [out.id]
        if rng.random() < 0.1:
            keep.append(rng.choice(made))
        for i in made:
            if i in self.pool and i not in keep:
                self.pool.remove(i)
        return [Stmt(lines, made + [out.id], feats)]

    def s_pool(self):
        """max_pool2d over the last two dims (memslim::max_pool2d's pattern)."""
        v = self.pick(lambda u: len(u.shape) in (3, 4) and u.shape[-1] >= 3 and u.shape[-2] >= 3)
        if v is None:
            return []
        k, st, pad = self.rng.choice([(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 1, 0)])
        ceil = self.rng.random() < 0.2

        def size(n):
            num = n + 2 * pad - k
            out = (-(-num // st) if ceil else num // st) + 1
            if ceil and (out - 1) * st >= n + pad:
                out -= 1
            return out

        shape = tuple(v.shape[:-2]) + (size(v.shape[-2]), size(v.shape[-1]))
        r = self.new(shape)
        self.save(v)
        line = "%s = F.max_pool2d(%s, %d, %d, %d, ceil_mode=%s)" % (V(r), V(v), k, st, pad, ceil)
        return [Stmt([line], [r.id], ["max_pool"])]

    def s_dropout(self):
        p = self.rng.choice([0.0, 0.1, 0.2, 0.5])  # 0.0: remove-identity-dropouts
        roll = self.rng.random()
        train = self.rng.choice(["self.training", "self.training", "True"])
        out = []
        if roll < 0.45:  # activation -> dropout (fuse-activation-dropout's pattern)
            v = self.pick()
            feat, t = self.rng.choice(ACTS[:13])
            a = self.new(v.shape)
            self.act_saves(feat, v, a)
            out.append(Stmt(["%s = %s" % (V(a), t.format(x=V(v)))], [a.id], ["act:" + feat]))
            src = a
        else:
            src = self.pick()
        k = self.rng.random()
        if k < 0.55:
            r = self.new(src.shape)
            line = "%s = F.dropout(%s, %s, %s)" % (V(r), V(src), p, train)
        elif k < 0.8:
            r = self.new(src.shape)
            n = self.name("drop")
            self.p.decls[n] = "self.%s = torch.nn.Dropout(%s)" % (n, p)
            line = "%s = self.%s(%s)" % (V(r), n, V(src))
        elif self.inter(src):
            r = self.new(src.shape, alias=src)
            line = "%s = F.dropout(%s, p=%s, training=%s, inplace=True)" % (V(r), V(src), p, train)
        else:
            r = self.new(src.shape)
            line = "%s = F.dropout(%s, p=%s, training=%s)" % (V(r), V(src), p, train)
        out.append(Stmt([line], [r.id], ["dropout"]))
        if (
            self.inter(r) and self.rng.random() < 0.35
        ):  # a later in-place write on dropout's output (issue 9)
            out.append(
                Stmt(
                    [self.rng.choice(INPLACE_WRITES).format(x=V(r))],
                    [],
                    ["inplace_write", "write_after_dropout"],
                )
            )
        return out

    def s_method(self):
        v = self.pick()
        n = self.name("fn")
        feat, t = self.rng.choice(HAND + ACTS)
        body = ["    def %s(self, x):" % n]
        if self.rng.random() < 0.3:
            body += [
                "        y = x * 1.0",
                "        y.mul_(0.5)",
                "        return %s" % t.format(x="y"),
            ]
        else:
            body += ["        return %s" % t.format(x="x")]
        self.p.methods[n] = body
        r = self.new(v.shape)
        self.save(v, r)
        return [Stmt(["%s = self.%s(%s)" % (V(r), n, V(v))], [r.id], ["method", "method:" + feat])]

    def block(self, gens, n) -> tuple:
        """Generates n statements in a nested scope; returns (stmts, scope values)."""
        saved = list(self.pool)
        self.depth += 1
        stmts = []
        for _ in range(n):
            stmts += self.rng.choice(gens)()
        self.depth -= 1
        local = [i for i in self.pool if i not in saved]
        self.pool = saved
        return stmts, local

    def s_if(self):
        if self.depth >= 2:
            return []
        v = self.pick()
        roll = self.rng.random()
        b = self.arg("bool")
        if b is not None and roll < 0.35:
            cond, feat = b, "if_arg"
        elif roll < 0.55:
            cond, feat = "self.training", "if_training"
        else:
            cond, feat = "self." + self.flag(), "if_attr"
        gens = [self.s_act, self.s_hand, self.s_pointwise, self.s_inplace, self.s_act]
        r_shape = v.shape
        blocks, leafy = [], False
        for _ in range(2):
            stmts, local = self.block(gens, self.rng.randint(0, 2))
            cands = [i for i in local if self.vals[i].shape == r_shape]
            src = self.vals[cands[-1]] if cands else None
            if src is None:
                tmp = self.new(r_shape)
                self.pool.remove(tmp.id)
                t, si, so = self.rng.choice(UNARY)
                if si:
                    self.save(v)
                if so:
                    self.save(tmp)
                stmts.append(Stmt(["%s = %s" % (V(tmp), t.format(x=V(v)))], [tmp.id], ["pw_unary"]))
                src = tmp
            leafy = leafy or src.leafy
            blocks.append((stmts, src))
        r = self.new(r_shape, leafy=leafy)
        # r aliases one branch's value or the other's: writing r is legal only if neither is saved
        if any(src.root in self.saved for _, src in blocks):
            self.save(r)
        for stmts, src in blocks:
            stmts.append(Stmt(["%s = %s" % (V(r), V(src))], [r.id]))
        alts = [blocks[0][0], blocks[1][0]]
        return [
            Stmt(
                ["if %s:" % cond, 0, "else:", 1], [r.id], [feat], [blocks[0][0], blocks[1][0]], alts
            )
        ]

    def s_no_grad(self):
        """`with torch.no_grad():` around a few statements (values made there stay visible
        and require no grad): a grad-mode switch no rewrite may reach across (a review
        on 2026-11-24 found recompute regions did)."""
        if self.depth >= 2 or self.in_loop:
            return []
        gens = [self.s_act, self.s_hand, self.s_pointwise, self.s_pointwise]
        self.depth += 1
        stmts = []
        for _ in range(self.rng.randint(1, 3)):
            stmts += self.rng.choice(gens)()
        self.depth -= 1
        if not stmts:
            return []
        defs = [d for st in stmts for d in st.defs]
        return [Stmt(["with torch.no_grad():", 0], defs, ["no_grad"], [stmts], [stmts])]

    def s_loop(self):
        if self.depth >= 2 or self.in_loop:
            return []
        v = self.pick()
        k = self.arg("int")
        trips = (
            k if (k is not None and self.rng.random() < 0.5) else str(self.rng.choice([1, 2, 3]))
        )
        feat = "loop_arg" if trips == k else "loop"
        gens = [self.s_act, self.s_hand, self.s_pointwise, self.s_inplace, self.s_linear]
        if self.rng.random() < 0.5:
            how = self.rng.choice(["%s", "%s * 1.0", "%s.clone()"])
            carried = self.new(v.shape, alias=v if how == "%s" else None)
            head = "%s = %s" % (V(carried), how % V(v))
            self.save(carried)  # the loop reassigns it: never written in place
            self.in_loop, self.loop_start = True, self.next_id
            stmts, local = self.block(gens, self.rng.randint(1, 3))
            cands = [i for i in local if self.vals[i].shape == v.shape]
            last = cands[-1] if cands else carried.id
            if self.rng.random() < 0.5:
                line = "%s = %s" % (V(carried), V(last))
            else:
                line = "%s = %s + %s * 0.5" % (V(carried), V(last), V(carried))
            stmts.append(Stmt([line], []))
            kind = "carried"
        else:
            carried = self.new(v.shape)
            head = "%s = torch.zeros_like(%s)" % (V(carried), V(v))
            self.save(carried)
            self.in_loop, self.loop_start = True, self.next_id
            t = self.new(v.shape)
            first = Stmt(["%s = %s * (@I@ + 1)" % (V(t), V(v))], [t.id], ["loop_index"])
            stmts, local = self.block(gens, self.rng.randint(0, 2))
            stmts.insert(0, first)
            if t.id in self.pool:
                self.pool.remove(t.id)
            cands = [i for i in local if self.vals[i].shape == v.shape] or [t.id]
            stmts.append(Stmt(["%s = %s + %s" % (V(carried), V(carried), V(cands[-1]))], []))
            kind = "accumulate"
        self.in_loop = False
        alt_unrolled = [Stmt([head], [carried.id])] + stmts  # one iteration, index 0
        s = Stmt(
            [head, "for i in range(%s):" % trips, 0],
            [carried.id],
            [feat, "loop_" + kind],
            [stmts],
            [alt_unrolled],
            inner=[carried.id],
        )
        return [s]

    # --- the program ------------------------------------------------------
    def program(self) -> Program:
        rng, p = self.rng, self.p
        p.dtype = rng.choices([d for d, _ in DTYPES], [w for _, w in DTYPES])[0]
        p.mode = "train" if rng.random() < 0.75 else "eval"
        p.batch = rng.choice([4, 8])
        d0 = rng.choice(WIDTHS)
        p.args.append(("x", "tensor", (p.batch, d0)))
        p.names[self.new((p.batch, d0), leafy=True).id] = "x"
        if rng.random() < 0.2:
            d1 = rng.choice(WIDTHS)
            p.args.append(("y", "tensor", (p.batch, d1)))
            p.names[self.new((p.batch, d1), leafy=True).id] = "y"
        if rng.random() < 0.08:
            p.args.append(("b", "bool", rng.random() < 0.5))
        if rng.random() < 0.08:
            p.args.append(("k", "int", rng.choice([0, 1, 2, 3])))
        if rng.random() < 0.08:
            p.args.append(("s", "float", rng.choice([0.5, 1.5, -0.25])))
        # Start like most models do: a linear layer on the input (also keeps
        # in-place writes off the input leaf).
        if rng.random() < 0.85:
            p.body += self.s_linear()
        gens = [
            (self.s_linear, 10),
            (self.s_act, 16),
            (self.s_hand, 12),
            (self.s_pointwise, 14),
            (self.s_inplace, 9),
            (self.s_view, 8),
            (self.s_if, 6),
            (self.s_loop, 5),
            (self.s_dropout, 6),
            (self.s_method, 3),
            (self.s_no_grad, 4),
            (self.s_norm, 6),
            (self.s_pool, 2),
        ]
        n = rng.randint(3, 13)
        while n > 0:
            g = rng.choices([g for g, _ in gens], [w for _, w in gens])[0]
            stmts = g()
            p.body += stmts
            n -= 1 if stmts else 0
        # Couplings (issue 12) from their own random stream, after the body: a seed
        # whose program gets none generates the program it generated before.
        extra = random.Random(p.seed * 7919 + 12)
        if extra.random() < 0.3:
            main, self.rng = self.rng, extra
            p.body += self.s_coupling()
            self.rng = main
        self.outputs()
        return p

    def outputs(self):
        rng, p = self.rng, self.p
        inputs = {i for i, (_, kind, _) in enumerate(self.p.args) if kind == "tensor"}
        defined = [i for i in self.pool if i not in inputs and self.vals[i].shape]
        if not defined:
            defined = [0]
        unused = [i for i in defined if self.uses.get(i, 0) == 0]
        sinks = unused or defined[-1:]
        n_out = min(len(sinks), rng.choice([1, 1, 2, 2, 3]))
        heads = sinks[-n_out:]
        rest = [i for i in sinks if i not in heads]
        outs = [[(h, "plain")] for h in heads]
        for i in rest:  # keep every sink alive: add it to some output
            o = rng.choice(outs)
            same = self.vals[i].shape == self.vals[o[0][0]].shape
            kind = rng.choice(["sum0", "sumk", "mean"] + (["add", "add"] if same else []))
            o.append((i, kind))
        for o in outs:  # the crash program's `v6 + v1.sum() * 0.0 + v1`
            if rng.random() < 0.2:
                o.append((o[0][0], rng.choice(["sum0", "sumk"])))
        if rng.random() < 0.1:
            outs.append([(rng.choice(defined), "mean")])
        p.outputs = outs
        p.tuple_return = len(outs) > 1 or rng.random() < 0.1


def generate(seed: int) -> Program:
    return Gen(seed).program()


def source(seed: int) -> str:
    return generate(seed).source()


if __name__ == "__main__":
    import sys

    for s in sys.argv[1:] or ["0"]:
        print(source(int(s)))
