//===- remove_identity_dropouts.cpp - dropout(x, 0.0, train) -> x -----------===//
//
// What: the TorchScript front end of the identity-dropout removal: a
// functional dropout whose p is the constant 0 is removed and its readers
// read its input, where the core (core/identity_dropout.cpp) finds one.
// Why: TorchScript's autodiff keeps a native_dropout mask for it where eager
// keeps nothing (ATen returns the input itself at p == 0); removed, the
// scripted model also aliases as eager does and draws no random number there.
// Runs after the canonicalizations and before every pricing pass, which then
// see the dropout's reader reading its input directly.
// Safety: through the SafetyGate, covering the dropout (nothing guarded: the
// rewrite keeps nothing new).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/identity_dropout.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

void run_remove_identity_dropouts(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  std::vector<NodeRef> sites;
  for (NodeRef n : view.nodes())
    if (is_identity_dropout(view, n)) sites.push_back(n);
  const CostPolicy policy = resolved(ctx.policy);
  for (NodeRef site : sites) {
    torch::jit::Node* n = JitGraphView::node(site);
    if (!ctx.gate->alive(n)) continue;
    const Decision d = decide_identity_dropout(view, site, policy);
    Proposal prop;
    prop.site = d.site;
    prop.covers = {n};
    prop.apply = [n]() {
      n->output()->replaceAllUsesWith(n->input(0));
      return std::string();
    };
    prop.rewrote = d.text;
    prop.price = d.price;
    ctx.gate->submit(prop);
  }
}

} // namespace memslim
