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
#include "memslim/core/site_loop.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

void run_max_pool_positions(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  for_each_site(
      view, is_max_pool_site,
      [&](const GraphView& v, NodeRef n) { return decide_max_pool(v, n, ctx.policy); }, ctx.alive(),
      [&](NodeRef site, MaxPoolDecision& d) {
        std::vector<torch::jit::Value*> guarded;
        for (ValueRef v : d.guarded) guarded.push_back(JitGraphView::value(v));
        ctx.gate->submit(swap_proposal(g, JitGraphView::node(site), kMemslimMaxPool2d,
                                       std::move(guarded), d.decision));
        return true;
      },
      ctx.record());
}

} // namespace memslim
