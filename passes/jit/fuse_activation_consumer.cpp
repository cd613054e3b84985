//===- fuse_activation_consumer.cpp - linear/conv(act(h)) -> act_* op -------===//
//
// What: the TorchScript front end of the activation -> consumer fusion: an
// aten activation whose output only linear / conv layers read becomes part of
// each of them (memslim::act_linear / act_conv*d(h, ..., act, params), keeping
// h instead of act(h)) where the core's decision (core/fuse_act_consumer.cpp,
// shared with the FX front end) says autograd then keeps fewer bytes.
// Runs before output-saving-norms (which then sees the norm's output kept by
// the fused ops) and before output-saving-activations (which would otherwise
// take the activation alone).
// Safety: through the SafetyGate, covering the activation and its consumers,
// guarding h, the activation's output and the consumers' weights.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/fuse_act_consumer.h"
#include "memslim/core/site_loop.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_fuse_activation_consumer(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  auto rewrite = [&](NodeRef site, ActConsumerDecision& d) {
    Node* a = JitGraphView::node(site);
    Proposal prop;
    prop.site = d.decision.site;
    prop.covers = {a};
    for (NodeRef p : d.passed) prop.covers.push_back(JitGraphView::node(p));
    std::vector<Node*> consumers;
    for (NodeRef c : d.consumers) consumers.push_back(JitGraphView::node(c));
    prop.covers.insert(prop.covers.end(), consumers.begin(), consumers.end());
    for (ValueRef v : d.guarded) prop.guarded.push_back(JitGraphView::value(v));
    Value* h = JitGraphView::value(d.h);
    const ActSpec spec = d.spec;
    const std::vector<std::string> kinds = d.fused_kind;
    prop.apply = [&g, h, consumers, kinds, spec]() {
      for (size_t i = 0; i < consumers.size(); ++i) {
        Node* c = consumers[i];
        Value *act, *params;
        {
          torch::jit::WithInsertPoint guard(c);
          act = g->insertConstant(spec.act);
          params = g->insertConstant(c10::IValue(spec.params));
        }
        std::vector<Value*> inputs{h};
        for (size_t k = 1; k < c->inputs().size(); ++k) inputs.push_back(c->input(k));
        inputs.push_back(act);
        inputs.push_back(params);
        replace_output(*g, c, c->output(), c10::Symbol::fromQualString(kinds[i]), inputs);
      }
      return std::string();
    };
    prop.rewrote = d.decision.text;
    prop.price = d.decision.price;
    ctx.gate->submit(prop);
    return true;
  };
  for_each_site(
      view, is_act_consumer_site,
      [&](const GraphView& v, NodeRef n) { return decide_act_consumer(v, n, ctx.policy); },
      ctx.alive(), rewrite, ctx.record());
}

} // namespace memslim
