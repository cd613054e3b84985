//===- fx_front_end.cpp - memslim's passes over an aten-level FX graph -----===//
#include "memslim/core/fx_front_end.h"

#include <stdexcept>
#include <unordered_set>

#include "memslim/core/canonicalize.h"
#include "memslim/core/functionalize.h"
#include "memslim/core/fuse_dropout.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/view_gate.h"
#include "memslim/passes/pass.h"

namespace memslim {

namespace {

// A Rewrote decision the gate refused (`why` not empty) becomes Kept with the
// gate's reason; otherwise node `n` becomes `kind` in the view (later decisions
// see the graph as it will be) and in the rewrites handed back.
void apply_or_keep(FxGraphView& g, NodeRef n, Decision& d, const std::string& kind,
                   const std::string& why, FxResult& out) {
  if (!why.empty()) {
    d.verdict = Decision::Verdict::Kept;
    d.text = why;
    return;
  }
  g.set_kind(g.id(n), kind);
  out.rewrites.push_back({g.id(n), kind, "", std::nullopt, {}});
}

// canonicalize-activations: a hand-written formula's root becomes the aten op
// of its input; the formula's nodes nobody reads any more go.
void canonicalize(FxGraphView& g, FxResult& out) {
  const ViewGate gate(g);
  std::unordered_set<size_t> gone;
  for (NodeRef root : canonicalize_roots(g)) {
    if (gone.count(g.id(root))) continue;
    auto d = decide_canonicalize(g, root);
    if (!d) continue;
    if (d->rewrite()) {
      std::string why = gate.check_between(d->covers);
      if (why.empty()) why = gate.check(root, {d->x, g.output(root, 0)});
      if (!why.empty()) {
        d->decision.verdict = Decision::Verdict::Kept;
        d->decision.text = why;
      } else {
        FxRewrite rw{g.id(root), d->op, "", std::vector<FxArg>{{g.id(d->x), {}}}, {}};
        std::vector<size_t> inputs{g.id(d->x)};
        if (!d->approximate.empty()) {
          FxGraphView::Value c;
          c.name = "'" + d->approximate + "'";
          c.constant = c10::IValue(d->approximate);
          inputs.push_back(g.add_value(std::move(c)));
          rw.args->push_back({std::nullopt, c10::IValue(d->approximate)});
        }
        g.rewrite_node(g.id(root), d->op, "", inputs);
        // Consumers before producers (covers lists producers first).
        for (auto it = d->covers.rbegin(); it != d->covers.rend(); ++it) {
          if (*it == root) continue;
          bool used = false;
          for (size_t o = 0; o < g.num_outputs(*it); ++o)
            used = used || !g.uses(g.output(*it, o)).empty();
          if (used) continue;
          rw.erased.push_back(g.id(*it));
          gone.insert(g.id(*it));
          g.erase_node(g.id(*it));
        }
        out.rewrites.push_back(std::move(rw));
      }
    }
    out.decisions.push_back(std::move(d->decision));
  }
}

// output-saving-activations: the TorchScript pass's loop with the view gate.
void output_saving(FxGraphView& g, const CostPolicy& policy, FxResult& out) {
  const ViewGate gate(g);
  std::vector<NodeRef> sites;
  for (NodeRef n : g.nodes())
    if (is_output_saving_site(g, n)) sites.push_back(n);
  for (NodeRef n : sites) {
    OutputSavingDecision d = decide_output_saving(g, n, policy);
    if (d.rewrite())
      apply_or_keep(g, n, d.decision, d.memslim_kind, gate.check(n, {d.guarded[0], d.guarded[1]}),
                    out);
    out.decisions.push_back(std::move(d.decision));
  }
}

// functionalize-inplace-activations: act_(x) -> act(x) where the gate proves
// nobody observes the write.
void functionalize(FxGraphView& g, FxResult& out) {
  const ViewGate gate(g);
  for (NodeRef n : g.nodes()) {
    auto d = decide_functionalize(g, n);
    if (!d) continue;
    if (d->rewrite()) {
      std::string why = gate.check_removed_write(n, d->written);
      if (why.empty()) why = gate.check(n, {d->guarded});
      apply_or_keep(g, n, d->decision, d->functional, why, out);
    }
    out.decisions.push_back(std::move(d->decision));
  }
}

// A new constant value in the view (an argument a rewrite adds).
size_t add_constant(FxGraphView& g, c10::IValue c, const std::string& name) {
  FxGraphView::Value v;
  v.name = name;
  v.constant = std::move(c);
  return g.add_value(std::move(v));
}

// fuse-activation-dropout: dropout(act(x)) -> memslim::activation_dropout(x, act,
// params, p, train, instance); the activation goes.
void fuse_dropout(FxGraphView& g, const CostPolicy& policy, FxResult& out) {
  const ViewGate gate(g);
  std::vector<NodeRef> sites;
  for (NodeRef n : g.nodes())
    if (is_fuse_dropout_site(g, n)) sites.push_back(n);
  if (sites.empty()) return;
  const CostPolicy& p = policy; // unresolved mask bytes: eager's, by device
  int64_t instance = next_dropout_instance(g);
  for (NodeRef d : sites) {
    FuseDropoutDecision dec = decide_fuse_dropout(g, d, p);
    if (dec.rewrite()) {
      std::string why = gate.check_between({dec.act, d});
      if (why.empty()) why = gate.check(d, {dec.guarded[0], dec.guarded[1], dec.guarded[2]});
      if (!why.empty()) {
        dec.decision.verdict = Decision::Verdict::Kept;
        dec.decision.text = why;
      } else {
        const c10::IValue act(dec.spec.act), params(dec.spec.params), id(instance++);
        std::vector<size_t> inputs{g.id(dec.x),
                                   add_constant(g, act, "'" + dec.spec.act + "'"),
                                   add_constant(g, params, "params"),
                                   g.id(g.input(d, 1)),
                                   g.id(g.input(d, 2)),
                                   add_constant(g, id, "instance")};
        std::vector<FxArg> args;
        for (size_t v : inputs) {
          const auto c = g.constant(g.value_ref(v));
          args.push_back(c ? FxArg{std::nullopt, *c} : FxArg{v, {}});
        }
        const size_t act_node = g.id(dec.act);
        g.rewrite_node(g.id(d), kActivationDropout, "", inputs);
        g.erase_node(act_node);
        out.rewrites.push_back({g.id(d), kActivationDropout, "", std::move(args), {act_node}});
      }
    }
    out.decisions.push_back(std::move(dec.decision));
  }
}

} // namespace

const std::vector<std::string>& fx_default_passes() {
  static const std::vector<std::string> passes = {kFunctionalizePass, kCanonicalizePass,
                                                  kFuseDropoutPass, kOutputSavingPass};
  return passes;
}

FxResult run_fx(FxGraphView& g, const std::vector<std::string>& passes, const CostPolicy& policy) {
  FxResult out;
  for (const std::string& p : passes) {
    if (p == kOutputSavingPass) {
      output_saving(g, policy, out);
    } else if (p == kFunctionalizePass) {
      functionalize(g, out);
    } else if (p == kCanonicalizePass) {
      canonicalize(g, out);
    } else if (p == kFuseDropoutPass) {
      fuse_dropout(g, policy, out);
    } else if (find_pass(p)) {
      out.decisions.push_back({p,
                               Decision::Verdict::Note,
                               "",
                               "not available in the FX front end yet (TorchScript only)",
                               {}});
    } else {
      throw std::invalid_argument("unknown pass '" + p + "'");
    }
  }
  return out;
}

} // namespace memslim
