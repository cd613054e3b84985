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
#include "memslim/core/site_loop.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_output_saving_activations(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  for_each_site(
      view, is_output_saving_site,
      [&](const GraphView& v, NodeRef n) { return decide_output_saving(v, n, ctx.policy); },
      ctx.alive(),
      [&](NodeRef site, OutputSavingDecision& d) {
        ctx.gate->submit(swap_proposal(
            g, JitGraphView::node(site), d.memslim_kind,
            {JitGraphView::value(d.guarded[0]), JitGraphView::value(d.guarded[1])}, d.decision));
        return true;
      },
      ctx.record());
}

} // namespace memslim
