"""Statement generators for layers and pointwise code: a mixin of gen.py's Gen.

What: linear layers (F.linear / nn.Linear / matmul), aten, module and in-place activations,
hand-written activations (one expression, spread over statements, FracAct-like),
pointwise unary / binary / addcmul / parameter-broadcast statements, in-place writes on
values and slices, and views (reshape / transpose / slicing / cat / chunk / contiguous).
Each `s_*` returns a list of Stmt and uses Gen's helpers (pick, new, param, save, ...).
Why: gen.py over the size rule; one module per family of statements.
"""

from __future__ import annotations

from gen_program import Stmt, V, Val
from gen_vocab import (
    ACTS,
    BINARY,
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


class LayerStatements:
    """Gen's statement generators for layers, activations, pointwise code and views."""

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

    def s_gated(self):
        """A gated MLP (SwiGLU / GeGLU, any activation of the table): act(g) * u, a down
        projection (fuse-gated-mlp's site). g and u are two projections of one value, or
        (the GLU form, half the time) the two halves of one projection's last dim: chunk,
        torch.split or slices, the gate the first half or the second."""
        v = self.pick()
        cin, ff = v.shape[-1], self.rng.choice(WIDTHS)
        cout = cin if self.in_loop else self.rng.choice(WIDTHS)
        feat, t = self.rng.choice(ACTS)
        form = self.rng.choice(["two", "two", "two", "chunk", "split", "slice"])
        shape, feats = v.shape[:-1] + (ff,), ["gated_mlp", "act:" + feat]
        if form == "two":
            g, u = self.new(shape), self.new(shape)
            wg, wu = self.param((ff, cin)), self.param((ff, cin))
            lines = [
                "%s = F.linear(%s, self.%s)" % (V(g), V(v), wg),
                "%s = F.linear(%s, self.%s)" % (V(u), V(v), wu),
            ]
        else:
            gu = self.new(v.shape[:-1] + (2 * ff,))
            g, u = (self.new(shape, contig=False, alias=gu) for _ in range(2))  # views of gu
            self.uses[gu.id] = self.uses.get(gu.id, 0) + 1
            halves = [V(g), V(u)] if self.rng.random() < 0.7 else [V(u), V(g)]
            lines = ["%s = F.linear(%s, self.%s)" % (V(gu), V(v), self.param((2 * ff, cin)))]
            if form == "chunk":
                lines.append("%s, %s = %s.chunk(2, dim=-1)" % (*halves, V(gu)))
            elif form == "split":
                lines.append("%s, %s = torch.split(%s, %d, -1)" % (*halves, V(gu), ff))
            else:
                lines.append(
                    "%s, %s = %s[..., :%d], %s[..., %d:]" % (*halves, V(gu), ff, V(gu), ff)
                )
            feats.append("gated_glu:" + form)
        a, r = self.new(shape), self.new(v.shape[:-1] + (cout,))
        self.save(v, g, u, a)
        wd = self.param((cout, ff))
        for x in (g, u, a):  # read here: not made program outputs (the site needs them alone)
            self.uses[x.id] = self.uses.get(x.id, 0) + 1
        prod = "%s * %s" % (t.format(x=V(g)), V(u))
        if self.rng.random() < 0.3:
            prod = "%s * %s" % (V(u), t.format(x=V(g)))
        lines += [
            "%s = %s" % (V(a), prod),
            "%s = F.linear(%s, self.%s)" % (V(r), V(a), wd),
        ]
        ids = [g.id, u.id, a.id, r.id] if form == "two" else [gu.id, g.id, u.id, a.id, r.id]
        return [Stmt(lines, ids, feats)]

    def s_rope(self):
        """RoPE's rotate_half as transformers writes it, `cat((-x2, x1), -1)` of the last
        dim's two halves (fuse-rotate-half's site), the split a constant or
        `x.shape[-1] // 2` (odd widths too); half the time inside `x * cos + rot * sin`
        with cos / sin buffers (no gradient), as apply_rotary_pos_emb reads them."""
        v = self.pick(lambda u: len(u.shape) >= 2 and u.shape[-1] >= 2)
        if v is None:
            return []
        n = v.shape[-1]
        k = n // 2
        split = "%s.shape[-1] // 2" % V(v) if self.rng.random() < 0.5 else str(k)
        lo = self.new(v.shape[:-1] + (k,), contig=False, alias=v)
        hi = self.new(v.shape[:-1] + (n - k,), contig=False, alias=v)
        r = self.new(v.shape)
        lines = [
            "%s = %s[..., :%s]" % (V(lo), V(v), split),
            "%s = %s[..., %s:]" % (V(hi), V(v), split),
            "%s = torch.cat((-%s, %s), dim=-1)" % (V(r), V(hi), V(lo)),
        ]
        ids, feats = [lo.id, hi.id, r.id], ["rotate_half"]
        for x in (lo, hi):  # read here: not made program outputs (the site needs them alone)
            self.uses[x.id] = self.uses.get(x.id, 0) + 1
        if self.rng.random() < 0.5:
            c, sn = self.name("cos"), self.name("sin")
            for b, f in ((c, "cos"), (sn, "sin")):
                self.p.decls[b] = (
                    'self.register_buffer("%s", torch.%s(torch.arange(%d.0) * 0.37), '
                    "persistent=False)" % (b, f, n)
                )
            o = self.new(v.shape)
            self.save(v, r)
            self.uses[r.id] = self.uses.get(r.id, 0) + 1
            lines.append("%s = %s * self.%s + %s * self.%s" % (V(o), V(v), c, V(r), sn))
            ids.append(o.id)
            feats.append("rope")
        return [Stmt(lines, ids, feats)]

    def s_head(self):
        """A loss head: cross_entropy over a linear's logits (fuse-loss-head's site), the
        targets made in the program (some ignored), any reduction, label smoothing, bf16
        logits cast to float sometimes; the loss times the head's input is the value."""
        v = self.pick(lambda u: len(u.shape) == 2)
        if v is None:
            return []
        rows, vocab = v.shape[0], self.rng.choice([11, 40, 97])
        w = self.param((vocab, v.shape[-1]))
        reduction = self.rng.choice(["mean", "sum", "none"])
        smoothing = self.rng.choice([0.0, 0.0, 0.1])
        ignore = self.rng.choice([-100, 3])
        logits = "F.linear(%s, self.%s)" % (V(v), w)
        if self.p.dtype == "bfloat16" and self.rng.random() < 0.6:
            logits += ".float()"  # transformers' loss: bf16 logits cast up
        targets = "torch.where(torch.arange(%d) %% 3 == 1, %d, (torch.arange(%d) * 7) %% %d)" % (
            rows,
            ignore,
            rows,
            vocab,
        )
        loss = "F.cross_entropy(%s, %s, reduction=%r, ignore_index=%d, label_smoothing=%r)" % (
            logits,
            targets,
            reduction,
            ignore,
            smoothing,
        )
        if reduction == "none":
            loss += ".unsqueeze(1)"
        # times v: an output of v's shape (the outputs are never 0-dim)
        r = self.new(v.shape)
        self.save(v)
        lines = ["%s = (%s * %s).to(%s.dtype)" % (V(r), loss, V(v), V(v))]
        return [Stmt(lines, [r.id], ["loss_head"])]

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
