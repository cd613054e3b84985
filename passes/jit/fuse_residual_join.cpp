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
#include <algorithm>
#include <functional>

#include "memslim/core/residual_join.h"
#include "memslim/core/site_loop.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

std::string module_state_path(const torch::jit::Value* v); // safety_gate.cpp

namespace {
// TorchScript reads a module buffer through a GetAttr per access: a node
// between the norm and the add (in any block under it) reading a value with
// the path of one of the norm's running statistics, or null.
const Node* reads_stats_by_path(Node* norm, Node* add) {
  if (norm->kind() != c10::aten::batch_norm || norm->inputs().size() < 5) return nullptr;
  std::vector<std::string> paths;
  for (size_t i : {3, 4}) {
    const std::string p = module_state_path(norm->input(i));
    if (!p.empty()) paths.push_back(p);
  }
  if (paths.empty()) return nullptr;
  std::function<const Node*(const Node*)> scan = [&](const Node* m) -> const Node* {
    for (const Value* in : m->inputs())
      if (std::find(paths.begin(), paths.end(), module_state_path(in)) != paths.end()) return m;
    for (const torch::jit::Block* b : m->blocks())
      for (const Node* k : b->nodes())
        if (const Node* hit = scan(k)) return hit;
    return nullptr;
  };
  for (Node* m = norm->next(); m != add && m->kind() != c10::prim::Return; m = m->next())
    if (const Node* hit = scan(m)) return hit;
  return nullptr;
}
} // namespace

void run_fuse_residual_join(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  auto rewrite = [&](NodeRef site, JoinDecision& d) {
    Node* add = JitGraphView::node(site);
    Node* norm = JitGraphView::node(d.norm);
    // An earlier join took the norm or the activation: nothing to say here.
    if (!ctx.gate->alive(norm) || (d.act && !ctx.gate->alive(JitGraphView::node(d.act))))
      return true;
    if (const Node* r = reads_stats_by_path(norm, add)) {
      d.decision.verdict = Decision::Verdict::Kept;
      d.decision.text = std::string(r->kind().toQualString()) +
                        " reads the norm's running statistics between the norm and the add";
      return false;
    }
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
    return true;
  };
  for_each_site(
      view, is_residual_join_site,
      [&](const GraphView& v, NodeRef n) { return decide_residual_join(v, n, ctx.policy); },
      ctx.alive(), rewrite, ctx.record(), /*skip_notes=*/true); // a Note: not a join
}

} // namespace memslim
