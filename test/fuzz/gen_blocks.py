"""Statement generators for norms, couplings, pooling and dropout: a mixin of gen.py's Gen.

What: norms (layer / rms / group / batch, functional or module, hand-written), residual
tails, invertible couplings (issue 12), pooling and dropout statements. Each `s_*` returns
a list of Stmt and uses Gen's helpers (pick, new, param, save, ...).
Why: gen.py over the size rule; one module per family of statements.
"""

from __future__ import annotations

import random

from gen_program import Stmt, V, Val
from gen_vocab import ACTS, INPLACE_WRITES


class BlockStatements:
    """Gen's statement generators for norms, residual tails, couplings, pooling and dropout."""

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
