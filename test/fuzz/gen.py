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

Files: this one holds `Gen` (its helpers, the control-flow statements, the program and its
outputs) and the entry points `generate` / `source`; gen_vocab.py the op vocabularies,
gen_program.py the program representation (Val, Stmt, Program), gen_layers.py and
gen_blocks.py Gen's other statement generators (mixins). The names other files use
(gen.Program, gen.Stmt, gen.generate, gen.source, ...) stay importable from here.
"""

from __future__ import annotations

import random
from typing import Dict, List, Optional

from gen_blocks import BlockStatements
from gen_layers import LayerStatements

# The vocabularies and the program representation, re-exported: shrink.py, fuzz.py and
# the tests use them as gen.Program, gen.Stmt, ...
from gen_program import Program, Stmt, V, Val  # noqa: F401
from gen_vocab import (  # noqa: F401
    ACTS,
    BINARY,
    DTYPES,
    HAND,
    INPLACE_ACTS,
    INPLACE_BINARY_WRITES,
    INPLACE_SLICE_WRITES,
    INPLACE_WRITES,
    MODULE_ACTS,
    OUTPUT_SAVERS,
    UNARY,
    WIDTHS,
)


class Gen(LayerStatements, BlockStatements):
    """The generator: one seeded random stream, the values made so far and their alias
    facts; statement generators here (control flow, helper methods) and in the mixins
    (gen_layers.py, gen_blocks.py)."""

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
        # Gated MLPs and loss heads likewise, from a stream of their own.
        extra = random.Random(p.seed * 7919 + 44)
        if extra.random() < 0.3:
            main, self.rng = self.rng, extra
            p.body += self.s_gated() if extra.random() < 0.5 else self.s_head()
            self.rng = main
        # RoPE's rotate_half likewise.
        extra = random.Random(p.seed * 7919 + 45)
        if extra.random() < 0.25:
            main, self.rng = self.rng, extra
            p.body += self.s_rope()
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
