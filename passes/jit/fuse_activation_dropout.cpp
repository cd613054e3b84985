//===- fuse_activation_dropout.cpp - dropout(act(x)) -> one memslim op ------===//
//
// What: aten::dropout(act(x), p, train) with act in gelu, silu, mish,
// hardswish, softplus, elu, celu, selu, sigmoid, tanh (and act's output used
// by nothing else) becomes memslim::activation_dropout(x, act, params, p,
// train, instance), which keeps its output plus 2 bits per element (dropout mask and the
// activation's branch) instead of the activation's input and dropout's float
// noise.
// Why: nn.TransformerEncoderLayer puts dropout between GELU and linear2, so
// output-saving GELU alone frees nothing there: dropout keeps its noise, and
// linear2 keeps dropout's output, not GELU's.
// Cost: aten keeps x (unless another consumer does) + dropout's noise (float,
// in eager autograd) or mask (bool, under TorchScript's optimising executor:
// CostPolicy::dropout_mask_bytes); memslim keeps the output (unless its
// consumer does) + n/4 bytes.
// The decision (sites, price, record) is the core's (core/fuse_dropout.cpp,
// shared with the FX front end); this file is its TorchScript front end.
// Runs before output-saving-activations, which would otherwise take the GELU.
// Safety: through the SafetyGate (no later in-place write to x, the
// activation's output or dropout's output; nothing written between the two).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/fuse_dropout.h"
#include "memslim/core/site_loop.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_fuse_activation_dropout(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  std::optional<int64_t> instance; // one scan, before the first fusion; each takes the next
  const CostPolicy policy = resolved(ctx.policy);
  const c10::Symbol fused = c10::Symbol::fromQualString(kActivationDropout);
  auto rewrite = [&](NodeRef site, FuseDropoutDecision& dec) {
    if (!instance) instance = next_dropout_instance(view);
    Node* d = JitGraphView::node(site);
    Node* a = JitGraphView::node(dec.act);
    Value* x = JitGraphView::value(dec.x);
    Value* out = d->output();
    Proposal prop;
    prop.site = dec.decision.site;
    prop.covers = {a, d};
    prop.guarded = {x, a->output(), out}; // aten kept x; the fused op keeps out
    const ActSpec spec = dec.spec;
    prop.apply = [&g, &instance, d, x, out, spec, fused]() {
      Value *act_name, *params, *id;
      {
        torch::jit::WithInsertPoint guard(d);
        act_name = g->insertConstant(spec.act);
        params = g->insertConstant(c10::IValue(spec.params));
        id = g->insertConstant((*instance)++);
      }
      replace_output(*g, d, out, fused, {x, act_name, params, d->input(1), d->input(2), id});
      return std::string();
    };
    prop.rewrote = dec.decision.text;
    prop.price = dec.decision.price;
    ctx.gate->submit(prop);
    return true;
  };
  for_each_site(
      view, is_fuse_dropout_site,
      [&](const GraphView& v, NodeRef n) { return decide_fuse_dropout(v, n, policy); }, ctx.alive(),
      rewrite, ctx.record());
}

} // namespace memslim
