//===- output_saving_activations.cpp - aten activation -> memslim op --------===//
//
// What: the TorchScript front end of the output-saving rewrite: replaces an
// aten activation (gelu, silu, mish, hardswish, softplus, elu, celu, selu,
// leaky_relu, hardsigmoid, relu) by its memslim op (same arguments) where the
// core's decision (core/output_saving.cpp, shared with the FX front end) says
// autograd then keeps fewer bytes.
// Safety: the rewrite goes through the SafetyGate, guarding the input and the
// output against later in-place writes: the output is what the backward reads,
// and a later write to the input means someone relies on aten's saved-input
// check. Writes before the activation (ResNet's `out += identity`) are harmless.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/output_saving.h"
#include "memslim/passes/jit_graph_view.h"
#include "memslim/passes/pass.h"
#include "memslim/passes/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_output_saving_activations(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  std::vector<NodeRef> sites;
  for (NodeRef n : view.nodes()) // every block: If branches too
    if (is_output_saving_site(view, n)) sites.push_back(n);
  for (NodeRef site : sites) {
    Node* n = JitGraphView::node(site);
    if (!ctx.gate->alive(n)) continue;
    OutputSavingDecision d = decide_output_saving(view, site, ctx.policy);
    if (!d.rewrite()) {
      ctx.remarks.add(std::move(d.decision));
      continue;
    }
    ctx.gate->submit(swap_proposal(
        g, n, d.memslim_kind,
        {JitGraphView::value(d.guarded[0]), JitGraphView::value(d.guarded[1])}, d.decision));
  }
}

} // namespace memslim
