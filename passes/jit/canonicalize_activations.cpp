//===- canonicalize_activations.cpp - hand-written activations -> aten ops --===//
//
// What: the TorchScript front end of the canonicalize decision
// (core/canonicalize.cpp, shared with the FX front end: the forms it matches,
// and why the erf GELU and other hardswish groupings stay as written): each
// match is a proposal to the SafetyGate covering the whole formula, so an
// in-place write between its nodes (`s = sigmoid(h); h.add_(1); h * s`) keeps
// it as written; the formula's root becomes the aten op.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/canonicalize.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_canonicalize_activations(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  for (NodeRef r : canonicalize_roots(view)) {
    Node* root = JitGraphView::node(r);
    if (!ctx.gate->alive(root)) continue;
    auto d = decide_canonicalize(view, r);
    if (!d) continue;
    if (!d->rewrite()) {
      ctx.remarks.add(std::move(d->decision));
      continue;
    }
    Value* x = JitGraphView::value(d->x);
    Proposal prop;
    prop.site = d->decision.site;
    for (NodeRef n : d->covers) prop.covers.push_back(JitGraphView::node(n));
    // The aten op keeps its input, as the formula's mul did; under TorchScript's
    // executor a DifferentiableGraph may keep its output (hardswish: measured by
    // the fuzzer), which the formula never kept: a later write to either keeps it.
    prop.guarded = {x, root->output()};
    const c10::Symbol op = c10::Symbol::fromQualString(d->op);
    prop.makes = {{op, x}};
    const std::string approximate = d->approximate;
    prop.apply = [&g, root, x, op, approximate]() {
      std::vector<Value*> args{x};
      if (!approximate.empty()) {
        torch::jit::WithInsertPoint guard(root);
        args.push_back(g->insertConstant(approximate));
      }
      replace_output(*g, root, root->output(), op, args);
      return std::string();
    };
    prop.rewrote = d->decision.text;
    ctx.gate->submit(prop);
  }
}

} // namespace memslim
