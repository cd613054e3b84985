//===- output_saving_norms.cpp - aten norm -> memslim norm ------------------===//
//
// What: the TorchScript front end of the output-saving norm rewrite: replaces
// aten::layer_norm / rms_norm / group_norm / batch_norm by its memslim op
// (same arguments) where the core's decision (core/output_saving_norms.cpp,
// shared with the FX front end) says autograd then keeps fewer bytes.
// Safety: through the SafetyGate, guarding the input (aten kept it), the
// output (the memslim op keeps it), gamma and beta (its backward reads them)
// against later in-place writes.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/output_saving_norms.h"

#include "memslim/passes/jit_graph_view.h"
#include "memslim/passes/pass.h"
#include "memslim/passes/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_output_saving_norms(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  std::vector<NodeRef> sites;
  for (NodeRef n : view.nodes())
    if (is_norm_site(view, n)) sites.push_back(n);
  for (NodeRef site : sites) {
    Node* n = JitGraphView::node(site);
    if (!ctx.gate->alive(n)) continue;
    NormDecision d = decide_output_saving_norm(view, site, ctx.policy);
    if (!d.rewrite()) {
      ctx.remarks.add(std::move(d.decision));
      continue;
    }
    std::vector<Value*> guarded;
    for (ValueRef v : d.guarded) guarded.push_back(JitGraphView::value(v));
    ctx.gate->submit(swap_proposal(g, n, d.memslim_kind, std::move(guarded), d.decision));
  }
}

} // namespace memslim
