//===- canonicalize_norms.cpp - hand-written RMSNorm -> aten::rms_norm ------===//
//
// What: the TorchScript front end of canonicalize-norms: a hand-written
// RMSNorm or LayerNorm formula (core/canonicalize_norms.h says which and when)
// becomes aten::rms_norm(x, [D], weight, eps) or aten::layer_norm(x - u, [D],
// weight, bias, eps, true) (the formula's centring kept), so output-saving-norms
// sees one op.
// Safety: through the SafetyGate, covering the formula's nodes (nothing
// written between them) and guarding x, the weight and the result.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/canonicalize_norms.h"

#include <algorithm>

#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_canonicalize_norms(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  // Last first: a LayerNorm's bias add is matched before the mul inside it.
  std::vector<NodeRef> roots = view.nodes();
  std::reverse(roots.begin(), roots.end());
  for (NodeRef r : roots) {
    Node* root = JitGraphView::node(r);
    if (!ctx.gate->alive(root)) continue;
    auto m = match_layer_norm(view, r);
    if (!m && view.kind(r) == "aten::mul") m = match_rms_norm(view, r);
    if (!m) continue;
    if (!m->rewrite()) {
      ctx.remarks.add(std::move(m->decision));
      continue;
    }
    const c10::Symbol op = c10::Symbol::fromQualString(m->op);
    Value* x = JitGraphView::value(m->x);
    Value* w = m->weight ? JitGraphView::value(m->weight) : nullptr;
    Value* b = m->bias ? JitGraphView::value(m->bias) : nullptr;
    Proposal prop;
    prop.site = m->decision.site;
    for (NodeRef n : m->covers) prop.covers.push_back(JitGraphView::node(n));
    prop.guarded = {x, root->output()};
    for (Value* p : {w, b})
      if (p) prop.guarded.push_back(p);
    prop.makes = {{op, x}};
    const int64_t dim = m->dim;
    const double eps = m->eps;
    Value* eps_value = m->eps_value ? JitGraphView::value(m->eps_value) : nullptr;
    if (eps_value && eps_value->type()->kind() != c10::TypeKind::FloatType) {
      m->decision.verdict = Decision::Verdict::Kept;
      m->decision.text = "eps is not a float";
      ctx.remarks.add(std::move(m->decision));
      continue;
    }
    const bool layer = m->op == "aten::layer_norm";
    prop.apply = [&g, root, x, w, b, op, dim, eps, eps_value, layer]() {
      std::vector<Value*> args{x};
      {
        torch::jit::WithInsertPoint guard(root);
        args.push_back(g->insertConstant(c10::IValue(std::vector<int64_t>{dim})));
        if (layer) {
          args.push_back(w ? w : g->insertConstant(c10::IValue()));
          args.push_back(b ? b : g->insertConstant(c10::IValue()));
          args.push_back(eps_value ? eps_value : g->insertConstant(eps));
          args.push_back(g->insertConstant(true)); // cudnn_enable, as F.layer_norm passes it
        } else {
          args.push_back(w);
          args.push_back(g->insertConstant(eps));
        }
      }
      replace_output(*g, root, root->output(), op, args);
      return std::string();
    };
    prop.rewrote = m->decision.text;
    ctx.gate->submit(prop);
  }
}

} // namespace memslim
