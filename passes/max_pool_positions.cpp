//===- max_pool_positions.cpp - aten::max_pool2d -> memslim::max_pool2d -----===//
//
// What: the TorchScript front end of the max-pool rewrite: aten::max_pool2d
// becomes memslim::max_pool2d (same arguments; keeps int8 window positions,
// not the input and int64 indices) where the core's decision
// (core/max_pool.cpp, shared with the FX front end) says it frees bytes.
// Runs before fuse-activation-consumer and output-saving, which then see the
// pool's input kept by nobody.
// Safety: through the SafetyGate, guarding the input and output.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/max_pool.h"
#include "memslim/passes/jit_graph_view.h"
#include "memslim/passes/pass.h"
#include "memslim/passes/safety_gate.h"

namespace memslim {

void run_max_pool_positions(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  std::vector<NodeRef> sites;
  for (NodeRef n : view.nodes())
    if (is_max_pool_site(view, n)) sites.push_back(n);
  for (NodeRef site : sites) {
    torch::jit::Node* n = JitGraphView::node(site);
    if (!ctx.gate->alive(n)) continue;
    MaxPoolDecision d = decide_max_pool(view, site, ctx.policy);
    if (!d.rewrite()) {
      ctx.remarks.add(std::move(d.decision));
      continue;
    }
    std::vector<torch::jit::Value*> guarded;
    for (ValueRef v : d.guarded) guarded.push_back(JitGraphView::value(v));
    ctx.gate->submit(swap_proposal(g, n, kMemslimMaxPool2d, std::move(guarded), d.decision));
  }
}

} // namespace memslim
