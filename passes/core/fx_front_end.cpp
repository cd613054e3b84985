//===- fx_front_end.cpp - memslim's passes over an aten-level FX graph -----===//
#include "memslim/core/fx_front_end.h"

#include <stdexcept>

#include "memslim/core/functionalize.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/view_gate.h"
#include "memslim/passes/pass.h"

namespace memslim {

namespace {

// output-saving-activations: the TorchScript pass's loop with the view gate.
void output_saving(FxGraphView& g, const CostPolicy& policy, FxResult& out) {
  std::vector<NodeRef> sites;
  for (NodeRef n : g.nodes())
    if (is_output_saving_site(g, n)) sites.push_back(n);
  for (NodeRef n : sites) {
    OutputSavingDecision d = decide_output_saving(g, n, policy);
    if (d.rewrite()) {
      const std::string why = ViewGate(g).check(n, {d.guarded[0], d.guarded[1]});
      if (!why.empty()) {
        d.decision.verdict = Decision::Verdict::Kept;
        d.decision.text = why;
      } else {
        g.set_kind(g.id(n), d.memslim_kind);
        out.rewrites.push_back({g.id(n), d.memslim_kind});
      }
    }
    out.decisions.push_back(std::move(d.decision));
  }
}

// functionalize-inplace-activations: act_(x) -> act(x) where the gate proves
// nobody observes the write.
void functionalize(FxGraphView& g, FxResult& out) {
  for (NodeRef n : g.nodes()) {
    auto d = decide_functionalize(g, n);
    if (!d) continue;
    if (d->rewrite()) {
      const ViewGate gate(g);
      std::string why = gate.check_removed_write(n, d->written);
      if (why.empty()) why = gate.check(n, {d->guarded});
      if (!why.empty()) {
        d->decision.verdict = Decision::Verdict::Kept;
        d->decision.text = why;
      } else {
        g.set_kind(g.id(n), d->functional);
        out.rewrites.push_back({g.id(n), d->functional});
      }
    }
    out.decisions.push_back(std::move(d->decision));
  }
}

} // namespace

const std::vector<std::string>& fx_default_passes() {
  static const std::vector<std::string> passes = {kFunctionalizePass, kOutputSavingPass};
  return passes;
}

FxResult run_fx(FxGraphView& g, const std::vector<std::string>& passes, const CostPolicy& policy) {
  FxResult out;
  for (const std::string& p : passes) {
    if (p == kOutputSavingPass) {
      output_saving(g, policy, out);
    } else if (p == kFunctionalizePass) {
      functionalize(g, out);
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
