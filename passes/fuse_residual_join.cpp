//===- fuse_residual_join.cpp - norm(x) + r -> memslim::<norm>_add ----------===//
//
// What: the TorchScript front end of the residual join: `norm(x) + r` (aten::add,
// or ResNet's `out += identity`, aten::add_ on the norm's output) becomes
// memslim::<norm>_add(residual, act, params, <the norm's arguments>) where the
// core's decision (core/residual_join.cpp, shared with the FX front end) says
// autograd then keeps fewer bytes; an activation read only by the add goes
// into the op. Runs after fuse-activation-consumer (which leaves ResNet's
// identity ReLU to this add alone) and before output-saving-norms (which then
// sees a downsample branch's norm output kept by the join).
// Safety: through the SafetyGate, covering the norm, the folded activation and
// the add (whose in-place write of the norm's fresh output it removes),
// guarding x, the norm's output, r, the residual, the sum, gamma and beta.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/residual_join.h"
#include "memslim/passes/jit_graph_view.h"
#include "memslim/passes/pass.h"
#include "memslim/passes/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

void run_fuse_residual_join(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  std::vector<NodeRef> sites;
  for (NodeRef n : view.nodes())
    if (is_residual_join_site(view, n)) sites.push_back(n);
  for (NodeRef site : sites) {
    Node* add = JitGraphView::node(site);
    if (!ctx.gate->alive(add)) continue;
    JoinDecision d = decide_residual_join(view, site, ctx.policy);
    if (d.decision.verdict == Decision::Verdict::Note) continue; // not a join
    if (!d.rewrite()) {
      ctx.remarks.add(std::move(d.decision));
      continue;
    }
    Node* norm = JitGraphView::node(d.norm);
    if (!ctx.gate->alive(norm) || (d.act && !ctx.gate->alive(JitGraphView::node(d.act)))) continue;
    Proposal prop;
    prop.site = d.decision.site;
    prop.covers = {norm, add};
    if (d.act) prop.covers.push_back(JitGraphView::node(d.act));
    for (ValueRef v : d.guarded) prop.guarded.push_back(JitGraphView::value(v));
    prop.removes_writes = d.inplace;
    Value* residual = JitGraphView::value(d.residual);
    const ActSpec spec = d.spec;
    const std::string kind = d.join_kind;
    prop.apply = [&g, add, norm, residual, spec, kind]() {
      Value *act, *params;
      {
        torch::jit::WithInsertPoint guard(add);
        act = g->insertConstant(spec.act);
        params = g->insertConstant(c10::IValue(spec.params));
      }
      std::vector<Value*> inputs{residual, act, params};
      for (Value* v : norm->inputs()) inputs.push_back(v);
      replace_output(*g, add, add->output(), c10::Symbol::fromQualString(kind), inputs);
      return std::string();
    };
    prop.rewrote = d.decision.text;
    prop.price = d.decision.price;
    ctx.gate->submit(prop);
  }
}

} // namespace memslim
