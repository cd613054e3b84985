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

#include "memslim/core/site_loop.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_output_saving_norms(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  for_each_site(
      view, is_norm_site,
      [&](const GraphView& v, NodeRef n) { return decide_output_saving_norm(v, n, ctx.policy); },
      ctx.alive(),
      [&](NodeRef site, NormDecision& d) {
        std::vector<Value*> guarded;
        for (ValueRef v : d.guarded) guarded.push_back(JitGraphView::value(v));
        ctx.gate->submit(swap_proposal(g, JitGraphView::node(site), d.memslim_kind,
                                       std::move(guarded), d.decision));
        return true;
      },
      ctx.record());
}

} // namespace memslim
