//===- canonicalize_norms.cpp - hand-written RMSNorm -> aten::rms_norm ------===//
//
// What: the TorchScript front end of canonicalize-norms: a hand-written
// RMSNorm formula (core/canonicalize_norms.h says which and when) becomes
// aten::rms_norm(x, [D], weight, eps), so output-saving-norms sees one op.
// Safety: through the SafetyGate, covering the formula's nodes (nothing
// written between them) and guarding x, the weight and the result.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/canonicalize_norms.h"

#include "memslim/passes/jit_graph_view.h"
#include "memslim/passes/pass.h"
#include "memslim/passes/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_canonicalize_norms(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  std::vector<NodeRef> roots;
  for (NodeRef n : view.nodes())
    if (view.kind(n) == "aten::mul") roots.push_back(n);
  const c10::Symbol op = c10::Symbol::fromQualString("aten::rms_norm");
  for (NodeRef r : roots) {
    Node* root = JitGraphView::node(r);
    if (!ctx.gate->alive(root)) continue;
    auto m = match_rms_norm(view, r);
    if (!m) continue;
    if (!m->rewrite()) {
      ctx.remarks.add(std::move(m->decision));
      continue;
    }
    Value* x = JitGraphView::value(m->x);
    Value* w = JitGraphView::value(m->weight);
    Proposal prop;
    prop.site = m->decision.site;
    for (NodeRef n : m->covers) prop.covers.push_back(JitGraphView::node(n));
    prop.guarded = {x, w, root->output()};
    prop.makes = {{op, x}};
    const int64_t dim = m->dim;
    const double eps = m->eps;
    prop.apply = [&g, root, x, w, op, dim, eps]() {
      Value *shape, *e;
      {
        torch::jit::WithInsertPoint guard(root);
        shape = g->insertConstant(c10::IValue(std::vector<int64_t>{dim}));
        e = g->insertConstant(eps);
      }
      replace_output(*g, root, root->output(), op, {x, shape, w, e});
      return std::string();
    };
    prop.rewrote = m->decision.text;
    ctx.gate->submit(prop);
  }
}

} // namespace memslim
