//===- safety_gate.cpp - check, apply or refuse every proposed rewrite -----===//
//
// What: the gate's state over the graph as it is when a proposal arrives
// (AliasDb rebuilt after every applied rewrite, the live values), submit(),
// which applies a proposal or records the refusal of the first failing rule,
// the clean-up of covered nodes a rewrite left unread, and the graph restore
// the driver uses to roll a failed pass back. The rules and their table:
// safety_gate_rules.cpp; the executor's model: safety_gate_executor.cpp.
//
//===----------------------------------------------------------------------===//
#include "memslim/jit/safety_gate.h"

#include <algorithm>
#include <functional>

#include "memslim/core/activation_table.h"
#include "memslim/core/saved_tensors.h"
#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/saved_tensor_analysis.h"

namespace memslim {

using torch::jit::AliasDb;
using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

std::string module_state_path(const Value* v) {
  const Node* p = v->node();
  if (p->kind() == c10::prim::GetAttr) {
    const Value* obj = p->input(0);
    const std::string base =
        obj->node()->kind() == c10::prim::Param ? "self" : module_state_path(obj);
    return base.empty() ? "" : base + "." + p->s(c10::attr::name);
  }
  if (SavedTensorAnalysis::is_view_of_input(p, 0)) return module_state_path(p->input(0));
  return "";
}

namespace {

// Drops every use inside `b` (nested blocks and returns included), so its
// nodes can be destroyed in any order.
void drop_all_uses(Block* b) {
  for (Node* n : b->nodes()) {
    n->removeAllInputs();
    for (Block* inner : n->blocks()) drop_all_uses(inner);
  }
  b->return_node()->removeAllInputs();
}
} // namespace

void restore_graph(Graph& g, Graph& src) {
  Block* b = g.block();
  drop_all_uses(b); // a broken graph may read values before they are made
  std::vector<Node*> nodes(b->nodes().begin(), b->nodes().end());
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) (*it)->destroy();
  while (!b->inputs().empty()) b->eraseInput(b->inputs().size() - 1);
  g.setInsertPoint(b);
  b->cloneFrom(src.block(), [](Value* v) -> Value* {
    TORCH_INTERNAL_ASSERT(false, "restore_graph: a top-level block has no outer values (%",
                          v->debugName(), ")");
  });
}

Proposal swap_proposal(const std::shared_ptr<Graph>& g, Node* n, const std::string& kind,
                       std::vector<Value*> guarded, const Decision& d) {
  Proposal prop;
  prop.site = d.site;
  prop.covers = {n};
  prop.guarded = std::move(guarded);
  const c10::Symbol op = c10::Symbol::fromQualString(kind);
  prop.apply = [g, n, op]() {
    replace_output(*g, n, n->output(), op, n->inputs());
    return std::string();
  };
  prop.rewrote = d.text;
  prop.price = d.price;
  return prop;
}

SafetyGate::SafetyGate(std::shared_ptr<Graph> graph, std::string pass, Remarks& remarks)
    : graph_(std::move(graph)), pass_(std::move(pass)), remarks_(remarks) {
  refresh();
}

SafetyGate::~SafetyGate() = default;

void SafetyGate::refresh() {
  live_.clear();
  torch::jit::DepthFirstGraphNodeIterator it(graph_);
  for (Node* n = it.next(); n; n = it.next()) live_.insert(n);
  alias_.reset();
  hidden_read_.reset();
  executor_hazard_.reset();
  live_values_.reset();
}

AliasDb& SafetyGate::alias() {
  if (!alias_) alias_ = std::make_unique<AliasDb>(graph_);
  return *alias_;
}

// Whether the graph's results or effects depend on `v`: it reaches a return,
// or a node that writes in place, has side effects, draws random numbers or has
// no schema; an If or Loop is live with anything in it. Dead code stays as the
// user wrote it for TorchScript to delete: the executor deletes it only after
// forming its DifferentiableGraphs, so a rewrite of dead code changes how it
// groups what that code reads (long-fuzz seed 246750: a region of a hardswish
// that only a dead loop read; linear -> abs -> div then formed one graph keeping
// the linear's output, which sigmoid_ wrote).
bool SafetyGate::live(const Value* v) {
  if (!live_values_) {
    live_values_.emplace();
    auto& live = *live_values_;
    std::vector<const Value*> work;
    auto mark = [&](const Value* x) {
      if (live.insert(x).second) work.push_back(x);
    };
    std::unordered_set<const Node*> live_nodes;
    std::function<void(const Node*)> mark_node = [&](const Node* n) {
      if (!live_nodes.insert(n).second) return;
      for (const Value* in : n->inputs()) mark(in);
      for (const torch::jit::Block* b : n->blocks()) {
        for (const Value* o : b->outputs()) mark(o);
        for (const Value* in : b->inputs()) mark(in);
      }
      // The node's enclosing control flow runs it.
      if (const Node* owner = n->owningBlock()->owningNode()) mark_node(owner);
    };
    for (const Value* o : graph_->outputs()) mark(o);
    torch::jit::DepthFirstGraphNodeIterator it(graph_);
    for (Node* m = it.next(); m; m = it.next())
      if (m->blocks().empty() && SavedTensorAnalysis::has_effects(m)) mark_node(m);
    while (!work.empty()) {
      const Value* x = work.back();
      work.pop_back();
      const Node* p = x->node();
      if (p->kind() == c10::prim::Param) {
        if (const Node* owner = p->owningBlock()->owningNode()) mark_node(owner);
        continue;
      }
      mark_node(p);
    }
  }
  return live_values_->count(v) > 0;
}

bool SafetyGate::submit(const Proposal& p) {
  if (auto why = named_refusal(p)) {
    remarks_.kept(pass_, p.site, why->reason, p.price, why->rule);
    ++refused_;
    return false;
  }
  const std::string failed = p.apply();
  if (!failed.empty()) {
    remarks_.kept(pass_, p.site, failed, p.price);
    ++refused_;
    refresh();
    return false;
  }
  // Covered nodes nobody reads any more go now, consumers before producers.
  std::vector<Node*> order = p.covers;
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return b->isBefore(a); });
  for (Node* n : order) {
    bool used = false;
    for (const Value* o : n->outputs()) used = used || o->hasUses();
    if (!used) n->destroy();
  }
  remarks_.add({pass_, Decision::Verdict::Rewrote, p.site, p.rewrote, p.price});
  ++applied_;
  refresh();
  return true;
}

} // namespace memslim
