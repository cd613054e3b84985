//===- recompute_pointwise_regions.cpp - elementwise region -> recompute op -===//
//
// What: finds maximal regions of elementwise ops (arithmetic, comparisons,
// where, exp/log/pow/lgamma/sigmoid/tanh/erf..., the aten activations; 0-dim
// tensors such as a trainable order and scalar constants as operands) and
// replaces each with one memslim::recompute_region op that keeps only the
// region's inputs and recomputes the region in backward.
// Why: a hand-written activation (seed 000) makes autograd keep every
// intermediate of its formula, ten or more full-size tensors per site, where
// its input alone determines them all.
// The decision (regions, price, placement, the poisoned-history check) is the
// core's (core/recompute_regions.cpp, shared with the FX front end); this file
// is its TorchScript front end: it follows storage with SavedTensorAnalysis
// (chunk pieces, If outputs), submits each region to the SafetyGate (regions
// in loops, and regions whose inputs or values are written in place between or
// after its nodes, are kept there) and applies it with the region's graph
// cloned into the op's text.
//
//===----------------------------------------------------------------------===//

#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "memslim/core/recompute_regions.h"
#include "memslim/jit/graph_text.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"
#include "memslim/jit/saved_tensor_analysis.h"

namespace memslim {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

namespace {

using NodeSet = std::unordered_set<const Node*>;

bool is_scalar_constant(const Value* v) {
  return !v->type()->cast<c10::TensorType>() && v->node()->kind() == c10::prim::Constant;
}

// The region of a decision as jit nodes and values.
struct JitRegion {
  std::vector<Node*> nodes;
  std::vector<Value*> inputs, outputs;
};

JitRegion jit_region(const Region& r) {
  JitRegion j;
  for (NodeRef n : r.nodes) j.nodes.push_back(JitGraphView::node(n));
  for (ValueRef v : r.inputs) j.inputs.push_back(JitGraphView::value(v));
  for (ValueRef v : r.outputs) j.outputs.push_back(JitGraphView::value(v));
  return j;
}

// Replaces the region by ListConstruct -> recompute_region -> ListUnpack.
// Returns "" or, when the region's text would not parse back, the parser's
// complaint (the graph is then left unchanged).
std::string rewrite(Graph& g, const JitRegion& r, Node* point) {
  NodeSet members(r.nodes.begin(), r.nodes.end());
  auto sub = std::make_shared<Graph>();
  std::unordered_map<Value*, Value*> env;
  for (Value* v : r.inputs) {
    Value* in = sub->addInput();
    if (v->hasDebugName()) in->setDebugName(v->debugName());
    in->setType(c10::TensorType::get());
    env[v] = in;
  }
  auto map = [&](Value* v) -> Value* {
    auto it = env.find(v);
    if (it != env.end()) return it->second;
    // A scalar constant: copied into the region's graph. Anything else means
    // the region's inputs are out of date (an internal error: the driver
    // rolls the pass back).
    TORCH_INTERNAL_ASSERT(is_scalar_constant(v), "recompute region: %", v->debugName(),
                          " is neither a region input nor a constant");
    Node* c =
        sub->appendNode(sub->createClone(v->node(), [](Value*) -> Value* { return nullptr; }));
    env[v] = c->output();
    return c->output();
  };
  for (Node* n : r.nodes) {
    Node* c = sub->appendNode(sub->createClone(n, map));
    for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = c->output(i);
  }
  for (Value* o : r.outputs) sub->registerOutput(env.at(o));
  std::string error; // the region is kept if its text cannot be read back
  const auto printed = op_graph_text(sub, &error);
  if (!printed) return error;
  const std::string& ir = *printed;

  torch::jit::WithInsertPoint guard(point);
  Value* list = g.insertNode(g.createList(c10::TensorType::get(), r.inputs))->output();
  Value* text = g.insertConstant(c10::IValue(ir));
  Node* op = g.insertNode(
      g.create(c10::Symbol::fromQualString("memslim::recompute_region"), {list, text}, 1));
  op->output()->setType(c10::ListType::ofTensors());
  Node* unpack = g.insertNode(g.createListUnpack(op->output(), r.outputs.size()));
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    Value* old = r.outputs[i];
    Value* now = unpack->output(i);
    now->setType(old->type());
    now->copyMetadata(old);
    const auto uses = old->uses();
    for (const auto& use : uses)
      if (!members.count(use.user)) use.user->replaceInput(use.offset, now);
  }
  return "";
}

} // namespace

void run_recompute_pointwise_regions(const std::shared_ptr<Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  const StorageFacts storage{
      [](ValueRef v) {
        return JitGraphView::ref(SavedTensorAnalysis::storage_root(JitGraphView::value(v)));
      },
      [](NodeRef n) {
        std::vector<ValueRef> out;
        for (const Value* w : SavedTensorAnalysis::written_inputs(JitGraphView::node(n)))
          out.push_back(JitGraphView::ref(w));
        return out;
      }};
  // Rebuilt after every applied rewrite: its map is keyed by Value pointers,
  // and a destroyed value's address may be reused by a new one.
  std::unique_ptr<MayRequireGrad> grad;
  int grad_at = -1;
  // One region at a time, described, priced and placed on the graph as the
  // earlier rewrites left it: a region reading another's outputs gets its
  // inputs from that region's op, and what it keeps is priced against what
  // that op keeps (ResMLP's chained residual regions each looked free while
  // the graph was unrewritten: predicted 24 x 49,152 B, measured 2,048 B each).
  for (std::vector<NodeRef>& nodes : form_regions(view)) {
    bool alive = true;
    for (NodeRef n : nodes) alive = alive && ctx.gate->alive(JitGraphView::node(n));
    if (!alive) continue; // cannot happen (regions are disjoint); never touch a dead node
    if (grad_at != ctx.gate->applied()) {
      grad = std::make_unique<MayRequireGrad>(view);
      grad_at = ctx.gate->applied();
    }
    RegionDecision d = decide_region(view, std::move(nodes), ctx.policy, *grad, storage);
    if (d.decision.verdict == Decision::Verdict::Note) continue; // keeps nothing today
    if (!d.rewrite()) {
      ctx.remarks.add(std::move(d.decision));
      continue;
    }
    auto r = std::make_shared<JitRegion>(jit_region(d.region));
    Node* point = JitGraphView::node(d.point);
    Proposal prop;
    prop.site = d.decision.site;
    prop.covers = r->nodes;
    for (ValueRef v : d.guarded) prop.guarded.push_back(JitGraphView::value(v));
    prop.apply = [&g, r, point]() {
      const std::string failed = rewrite(*g, *r, point);
      return failed.empty() ? failed : "its graph text does not parse back (" + failed + ")";
    };
    prop.rewrote = d.decision.text;
    prop.price = d.decision.price;
    ctx.gate->submit(prop);
  }
}

} // namespace memslim
