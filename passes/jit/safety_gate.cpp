//===- safety_gate.cpp - check, apply or refuse every proposed rewrite -----===//
//
// What: the checks of safety_gate.h over the graph as it is when a proposal
// arrives (AliasDb rebuilt after every applied rewrite), the clean-up of
// covered nodes a rewrite left unread, and the graph restore the driver uses
// to roll a failed pass back.
//
//===----------------------------------------------------------------------===//
#include "memslim/jit/safety_gate.h"

#include <torch/csrc/jit/runtime/autodiff.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <unordered_map>

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

namespace {

bool same_or_nested(const std::string& a, const std::string& b) {
  auto prefix = [](const std::string& p, const std::string& s) {
    return s.size() > p.size() && s.compare(0, p.size(), p) == 0 && s[p.size()] == '.';
  };
  return a == b || prefix(a, b) || prefix(b, a);
}

std::string name_of(const Value* v) { return "%" + v->debugName(); }

// `v` and every value that may be the very same tensor through such ops, in
// either direction (AliasDb cannot know: the schemas say nothing).
std::vector<Value*> same_tensor_closure(Value* v) {
  std::vector<Value*> out{v};
  std::unordered_set<Value*> seen{v};
  for (size_t i = 0; i < out.size(); ++i) {
    Value* cur = out[i];
    auto visit = [&](Value* next) {
      if (seen.insert(next).second) out.push_back(next);
    };
    if (SavedTensorAnalysis::returns_input_undeclared(cur->node()) &&
        !cur->node()->inputs().empty())
      visit(cur->node()->input(0));
    for (const auto& use : cur->uses())
      if (use.offset == 0 && SavedTensorAnalysis::returns_input_undeclared(use.user))
        visit(use.user->output());
  }
  return out;
}

// Why an in-place write to `w` could be observed by someone other than the
// writer (the core's rule, core/view_gate.cpp, shared with the FX gate).
std::optional<std::string> write_observable(const Value* w) {
  return memslim::write_observable(JitGraphView(), JitGraphView::ref(w));
}

// relu6 and hardtanh: the executor differentiates them, although
// torch::jit::isDifferentiable says no, with symbolic gradients that read their
// result where eager's keep the input (measured on torch 2.14: linear -> tanh ->
// op -> mul scripted, the op inside the DifferentiableGraph for relu6, hardtanh,
// clamp, abs, exp, softplus, silu, gelu, leaky_relu, hardswish, hardsigmoid; not
// for elu, celu, selu, mish, logsigmoid). Long-fuzz seed 266858: functionalized
// tanh_ -> relu6 formed a graph keeping relu6's output, which add_ then wrote.
bool clamping_activation(const Node* n) {
  return n->kind() == c10::aten::relu6 || n->kind() == c10::aten::hardtanh;
}

// Whether TorchScript's executor may put `n` in a DifferentiableGraph.
bool executor_differentiates(const Node* n) {
  return clamping_activation(n) || torch::jit::isDifferentiable(const_cast<Node*>(n));
}

// Activations whose symbolic gradient reads their output where aten's reads
// their input: an in-place write to that output after them raises in backward
// whenever the executor puts them in a DifferentiableGraph (and trains in
// eager). Measured on torch 2.14 with `v = (x * 2 + 1); a = act(v); b = a * 3;
// a.add_(1)` scripted: softplus, hardswish, leaky_relu, relu6 fail from the
// second call; gelu, silu, mish, hardsigmoid, elu, celu, selu, hardtanh,
// logsigmoid, abs, clamp train (sigmoid, tanh, relu, exp fail in eager too).
bool symbolic_gradient_reads_output(const Node* n) {
  const c10::Symbol k = n->kind();
  return k == c10::aten::softplus || k == c10::aten::hardswish || k == c10::aten::leaky_relu ||
         k == c10::aten::relu6;
}

// TorchScript's executor runs chains of nodes its autodiff differentiates (in
// one block, linked producer -> consumer) as DifferentiableGraphs, which keep
// what their backward formulas read, their outputs included. A rewrite changes
// those chains (a memslim op ends one; a functionalized activation joins one),
// and with them which values such a graph keeps. The chain a rewrite touches:
// the covered nodes and every differentiable node linked to them.
std::vector<const Node*> executor_chain(const std::vector<Node*>& covers,
                                        const std::unordered_set<const Node*>& members,
                                        const std::shared_ptr<Graph>& graph) {
  const Block* block = covers.front()->owningBlock();
  // The blocks around the covered nodes count too: a rewrite inside an If's
  // branch changes how the executor sees the values it reads from outside
  // (a region's Tensor[] input is a wildcard to AliasDb, so CSE stops merging
  // them, and the outer block's chain grows past the executor's inlining
  // threshold). Long-fuzz seed 363139: a region in an else-branch reading
  // `v3 * 1.0` and a view of x made unsqueeze -> squeeze -> mul, softplus one
  // graph keeping softplus's output, which tanh_ then wrote.
  std::unordered_set<const Block*> blocks;
  for (const Block* b = block; b;) {
    blocks.insert(b);
    const Node* owner = b->owningNode();
    b = owner ? owner->owningBlock() : nullptr;
  }
  // In-place ops stay out of those graphs (seen in the executor's plans; autodiff
  // has formulas for some of them, e.g. add_).
  // aten::chunk and its unpacking are linked too: the executor turns them into
  // prim::ConstantChunk, which its autodiff differentiates (long-fuzz seed
  // 143617: linear -> chunk -> softplus rewritten reshaped linear's chain).
  auto is_chunk_unpack = [](const Node* n) {
    return n->kind() == c10::prim::ListUnpack && n->input(0)->node()->kind() == c10::aten::chunk;
  };
  // A loop with a constant trip count is unrolled by the executor: its body's
  // nodes join the chains around it (long-fuzz seed 208175: a region after
  // `for i in range(2): v2 = v0 * (i + 1); mish(v2)` regrouped the unrolled body
  // into a graph keeping v0 * 1, which the executor folds to v0).
  auto unrolled = [&](const Node* n) {
    if (n->kind() != c10::prim::Loop || !blocks.count(n->owningBlock())) return false;
    const auto trips = torch::jit::constant_as<int64_t>(n->input(0));
    const auto cond = torch::jit::constant_as<bool>(n->input(1));
    return trips && cond && *cond;
  };
  auto linked = [&](const Node* n) {
    if (unrolled(n)) return true;
    const Node* owner = n->owningBlock()->owningNode();
    if (!blocks.count(n->owningBlock()) && !(owner && unrolled(owner))) return false;
    if (members.count(n) || n->kind() == c10::aten::chunk || is_chunk_unpack(n)) return true;
    const c10::FunctionSchema* s = n->maybeSchema();
    if (s && s->is_mutable()) return false;
    return executor_differentiates(n);
  };
  // Links are tensors (a shared None or int constant links nothing), and not a
  // tensor that a node the rewrite keeps writes in place between its producer
  // and the consumer: the executor does not merge nodes across a write. (A
  // covered write goes with the rewrite: long-fuzz seed 123965, cat -> sigmoid_
  // functionalized let cat's graph keep its input.) A write before the producer
  // or after the consumer cuts nothing (long-fuzz seed 164746: relu_ before
  // unsqueeze -> sigmoid -> softplus, which the executor merged into a graph
  // keeping softplus's output, then written by dropout_).
  std::unordered_map<const Node*, size_t> pos;
  std::unordered_map<const Value*, std::vector<size_t>> writes_at; // storage root -> writers
  {
    std::shared_ptr<Graph> g = graph;
    torch::jit::DepthFirstGraphNodeIterator it(g);
    for (Node* m = it.next(); m; m = it.next()) {
      pos[m] = pos.size() + 1;
      if (!members.count(m))
        for (const Value* w : SavedTensorAnalysis::written_inputs(m))
          writes_at[SavedTensorAnalysis::storage_root(w)].push_back(pos[m]);
    }
  }
  auto link = [&](const Value* v, const Node* consumer) {
    if (v->node()->kind() == c10::aten::chunk) return true; // its pieces' list
    if (!v->type()->cast<c10::TensorType>()) return false;
    const auto w = writes_at.find(SavedTensorAnalysis::storage_root(v));
    if (w == writes_at.end()) return true;
    const auto p = pos.find(v->node());
    const size_t lo = p == pos.end() ? 0 : p->second; // graph inputs: from the start
    const auto c = pos.find(consumer);
    const size_t hi = c == pos.end() ? std::numeric_limits<size_t>::max() : c->second;
    for (size_t at : w->second)
      if (at > lo && at < hi) return false;
    return true;
  };
  std::vector<const Node*> chain(covers.begin(), covers.end());
  std::unordered_set<const Node*> seen(chain.begin(), chain.end());
  for (size_t i = 0; i < chain.size(); ++i) {
    const Node* n = chain[i];
    if (unrolled(n))
      for (const Node* b : n->blocks()[0]->nodes())
        if (linked(b) && seen.insert(b).second) chain.push_back(b);
    for (const Value* v : n->inputs())
      if (link(v, n) && linked(v->node()) && seen.insert(v->node()).second)
        chain.push_back(v->node());
    for (const Value* o : n->outputs())
      for (const auto& use : o->uses())
        if (link(o, use.user) && linked(use.user) && seen.insert(use.user).second)
          chain.push_back(use.user);
  }
  return chain;
}

} // namespace

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
// Whether data flowing from `from` reaches a node for which `stop` holds (a
// node using one of them, transitively; `stop` also sees block returns). An
// If's block return flows into the If's output; a Loop's carried input into
// the body's parameter and the loop's output, and the body's return slot i > 0
// into output i - 1 and the next trip's parameter i (slot 0, the continue
// condition, flows nowhere).
bool flows_to(std::vector<const Value*> from, const std::function<bool(const Node*)>& stop) {
  std::unordered_set<const Value*> seen(from.begin(), from.end());
  auto push = [&](const Value* v) {
    if (seen.insert(v).second) from.push_back(v);
  };
  while (!from.empty()) {
    const Value* x = from.back();
    from.pop_back();
    for (const auto& use : x->uses()) {
      const Node* u = use.user;
      if (stop(u)) return true;
      if (u->kind() == c10::prim::Return) {
        const Node* owner = u->owningBlock()->owningNode();
        if (owner && owner->kind() == c10::prim::If) push(owner->output(use.offset));
        if (owner && owner->kind() == c10::prim::Loop && use.offset > 0) {
          push(owner->output(use.offset - 1));
          push(owner->blocks()[0]->inputs()[use.offset]);
        }
        continue;
      }
      if (u->kind() == c10::prim::Loop) {
        if (use.offset >= 2) { // after max_trip_count and the start condition
          push(u->output(use.offset - 2));
          push(u->blocks()[0]->inputs()[use.offset - 1]);
        }
        continue;
      }
      for (const Value* o : u->outputs()) push(o);
    }
  }
  return false;
}

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

// A node writing in place a tensor whose storage is `v`'s, reached through a
// dropout that may return its input (AliasDb sees no such write), or null.
const Node* SafetyGate::hidden_writer(const Value* v) {
  torch::jit::DepthFirstGraphNodeIterator it(graph_);
  for (Node* m = it.next(); m; m = it.next())
    for (const Value* w : SavedTensorAnalysis::written_inputs(m)) {
      bool hidden = false;
      if (SavedTensorAnalysis::storage_root(w, &hidden) == v && hidden) return m;
    }
  return nullptr;
}

// Whether the program's result depends on an alias AliasDb cannot see: a
// dropout that may return its input (eval mode, p == 0) makes its output and
// input one tensor, and something writes it in place on one side while
// something else reads or writes it on the other. TorchScript's executor
// orders nodes by AliasDb when it forms its DifferentiableGraphs, so it may
// move the one across the other; the scripted graph as written only happens to
// keep them in order, and any rewrite anywhere in the graph changes the
// grouping (long-fuzz seed 205868: elu -> eval dropout -> hardsigmoid_, and
// `elu * 1.0` read after it; a region rewrite elsewhere let the executor run
// the read before the write on the second call). The reason, or nullopt. A
// dropout whose input nothing else touches (`h = dropout(h); h += residual`)
// hides nothing.
const std::optional<std::string>& SafetyGate::hidden_alias_read() {
  if (hidden_read_) return *hidden_read_;
  hidden_read_.emplace();
  std::vector<Node*> nodes;
  std::unordered_set<const Value*> hidden_roots; // reached through such a dropout
  torch::jit::DepthFirstGraphNodeIterator it(graph_);
  for (Node* m = it.next(); m; m = it.next()) {
    nodes.push_back(m);
    if (SavedTensorAnalysis::may_return_input(m))
      hidden_roots.insert(SavedTensorAnalysis::storage_root(m->input(0)));
  }
  if (hidden_roots.empty()) return *hidden_read_;
  struct Access {
    const Node* node;
    const Node* side; // the nearest dropout on the way to the root, or null
    bool write;
  };
  // Per root: who touches it, and from which side. Two accesses through the same
  // nearest dropout reach one value AliasDb knows; through different ones (or
  // none), one tensor AliasDb sees as two.
  std::unordered_map<const Value*, std::vector<Access>> accesses;
  for (const Node* m : nodes) {
    // Dropouts and views pass the tensor on: their outputs' users count instead.
    if (SavedTensorAnalysis::may_return_input(m)) continue;
    const std::vector<const Value*> written = SavedTensorAnalysis::written_inputs(m);
    for (size_t i = 0; i < m->inputs().size(); ++i) {
      const Value* v = m->input(i);
      if (!v->type()->cast<c10::TensorType>() || SavedTensorAnalysis::is_view_of_input(m, i))
        continue;
      std::vector<const Node*> dropouts;
      const Value* r = SavedTensorAnalysis::storage_root(v, nullptr, &dropouts);
      if (!hidden_roots.count(r)) continue;
      const bool write = std::find(written.begin(), written.end(), v) != written.end();
      accesses[r].push_back({m, dropouts.empty() ? nullptr : dropouts.front(), write});
    }
  }
  for (const auto& [r, list] : accesses)
    for (const Access& w : list) {
      if (!w.write) continue;
      for (const Access& o : list) {
        if (o.side == w.side) continue;
        // One reads what the other made (zoo models with p = 0 dropout:
        // `relu_(h)` -> dropout -> linear): data flow orders them whatever
        // AliasDb sees.
        auto reads_output_of = [](const Node* later, const Node* earlier) {
          std::vector<const Value*> outs(earlier->outputs().begin(), earlier->outputs().end());
          return flows_to(outs, [later](const Node* u) { return u == later; });
        };
        if (reads_output_of(o.node, w.node) || reads_output_of(w.node, o.node)) continue;
        hidden_read_->emplace(
            std::string(w.node->kind().toQualString()) + " writes " + name_of(r) + " in place " +
            (w.side ? "through a dropout that may return it"
                    : "under a dropout that may return it") +
            ", an alias AliasDb cannot see, and " + o.node->kind().toQualString() +
            " uses it on the other side: TorchScript's executor may reorder "
            "the two once any rewrite changes its graphs");
        return *hidden_read_;
      }
    }
  return *hidden_read_;
}

// Programs TorchScript's own executor fails on for some ways of cutting the
// graph into DifferentiableGraphs, but not for others. The scripted program as
// written may happen to be cut the safe way; any rewrite anywhere changes the
// cuts, so in such a graph every rewrite is kept. The reason, or nullopt.
//  - An in-place write to a view (aten::t, view, slice...) that a differentiable
//    view op made of a tensor a differentiable op computed: a graph holding
//    both returns the view without its base, and the write raises "a view of a
//    leaf Variable that requires grad is being used in an in-place operation"
//    (`v3 = v0 * 2; silu_(v3.t())` fails without memslim when t joins the mul's
//    graph; long-fuzz seed 315436: a region after silu_(where(...).t()) made
//    the executor cut the nodes before it that way).
//  - An in-place write to the output of an activation whose symbolic gradient
//    reads it (symbolic_gradient_reads_output): a graph holding the activation
//    keeps that output, and the write raises in backward. Long-fuzz seed
//    363139: `v5 = softplus(v3); v5.tanh_()` trained scripted because torch's
//    CSE and the executor's inlining threshold left softplus outside any
//    graph; a recompute region after an If reading a value derived from v5
//    (a Tensor[] input, a wildcard to AliasDb) stopped that CSE, and
//    unsqueeze -> squeeze -> softplus, mul became a graph keeping v5.
//  - An aten::chunk piece whose value reaches no result: the executor's chunk
//    backward then gets an undefined gradient and raises "tensor does not have
//    a device" (`a, b = y.chunk(2, 1); return x + silu(b).mean()` fails without
//    memslim; long-fuzz seed 286566: x * sigmoid(x) -> silu beside the user's
//    silu of the same piece, which torch's CSE merged, regrouped the graph).
const std::optional<std::string>& SafetyGate::executor_hazard() {
  if (executor_hazard_) return *executor_hazard_;
  executor_hazard_.emplace();
  // Whether `v` flows into the graph's results (data flow only: a write to a
  // value nobody reads again is dead code to TorchScript's DCE).
  auto reaches_result = [](const Value* v) {
    return flows_to({v}, [](const Node* u) {
      return u->kind() == c10::prim::Return && !u->owningBlock()->owningNode();
    });
  };
  torch::jit::DepthFirstGraphNodeIterator it(graph_);
  for (Node* m = it.next(); m; m = it.next()) {
    if (m->kind() == c10::aten::chunk && m->output()->uses().size() == 1 &&
        m->output()->uses()[0].user->kind() == c10::prim::ListUnpack) {
      const Node* unpack = m->output()->uses()[0].user;
      for (const Value* piece : unpack->outputs())
        if (!reaches_result(piece)) {
          executor_hazard_->emplace(
              "the aten::chunk piece " + name_of(piece) +
              " reaches no result: TorchScript's executor raises in backward (\"tensor does not "
              "have a device\") for some ways of cutting its graphs, and any rewrite changes them");
          return *executor_hazard_;
        }
    }
    if (SavedTensorAnalysis::writes_nothing(m)) continue;
    for (const Value* w : SavedTensorAnalysis::written_inputs(m)) {
      const Node* producer = SavedTensorAnalysis::storage_root(w)->node();
      if (symbolic_gradient_reads_output(producer)) {
        executor_hazard_->emplace(
            std::string(m->kind().toQualString()) + " writes " + name_of(w) + ", the output of " +
            producer->kind().toQualString() +
            ", in place: TorchScript's symbolic gradient of that op reads its output, so the "
            "write raises in backward once any rewrite puts it in a DifferentiableGraph");
        return *executor_hazard_;
      }
      for (const Value* v = w; SavedTensorAnalysis::is_view_of_input(v->node(), 0);
           v = v->node()->input(0)) {
        const Node* view = v->node();
        const Node* base = view->input(0)->node();
        if (!executor_differentiates(view) || base->kind() == c10::prim::Param ||
            !executor_differentiates(base))
          continue;
        executor_hazard_->emplace(
            std::string(m->kind().toQualString()) + " writes " + name_of(w) +
            " in place, a view (" + view->kind().toQualString() + ") of " +
            name_of(view->input(0)) +
            ": TorchScript's executor may return it from a DifferentiableGraph without its base "
            "once any rewrite changes its graphs, and the write then raises");
        return *executor_hazard_;
      }
    }
  }
  return *executor_hazard_;
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

std::optional<std::string> SafetyGate::refusal(const Proposal& p) {
  if (p.covers.empty()) return "the proposal covers no node (internal)";
  for (const Node* n : p.covers)
    if (!alive(n)) return "an earlier rewrite changed it";
  const Block* block = p.covers.front()->owningBlock();
  for (const Node* n : p.covers)
    if (n->owningBlock() != block) return "its nodes lie in different blocks";
  if (inside_loop(p.covers.front())) return "inside a loop (not analysed)";
  // Covered nodes of a replaying rewrite (block recompute) that write a value
  // other than module state: judged below, once `outside` is known.
  std::vector<Node*> inside_writers;
  for (Node* n : p.covers) {
    const c10::FunctionSchema* s = n->maybeSchema();
    if (!s && !n->kind().is_prim())
      return std::string(n->kind().toQualString()) + " in it matches no registered schema";
    if (n->hasSideEffects() || (s && s->is_mutable() && !p.removes_writes)) {
      bool state_only = p.replays_writes && !n->hasSideEffects();
      for (const Value* w : SavedTensorAnalysis::written_inputs(n))
        state_only = state_only && !module_state_path(w).empty();
      if (!state_only && p.replays_writes && !n->hasSideEffects())
        inside_writers.push_back(n);
      else if (!state_only)
        return std::string(n->kind().toQualString()) + " in it writes in place or has side effects";
    }
    if (p.removes_writes)
      for (const Value* w : SavedTensorAnalysis::written_inputs(n))
        if (auto why = write_observable(w)) return *why;
  }
  bool any_live = false;
  for (const Node* n : p.covers)
    for (const Value* o : n->outputs()) any_live = any_live || live(o);
  if (!any_live) return "its result is never used (dead code, left for TorchScript to delete)";
  std::vector<Node*> order = p.covers;
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->isBefore(b); });
  const Node* first = order.front();
  const Node* last = order.back();
  std::unordered_set<const Node*> members(order.begin(), order.end());
  for (const Node* m = first->next(); m != last; m = m->next())
    if (switches_grad_mode(m->kind().toQualString()))
      return std::string(m->kind().toQualString()) +
             " (a with-block: grad mode, autocast) begins or ends between its nodes";

  // What a write may not touch: between the covered nodes, anything they read
  // or make; after the first, anything guarded. Module state goes by path.
  struct Watched {
    torch::jit::ValueSet plain;
    std::vector<std::pair<std::string, const Value*>> state;
    void add(Value* value) {
      if (!value->type()->cast<c10::TensorType>()) return;
      for (Value* v : same_tensor_closure(value)) {
        const std::string path = module_state_path(v);
        if (path.empty())
          plain.insert(v);
        else
          state.emplace_back(path, v);
      }
    }
  } between, after;
  // Nodes nested in a covered If (a residual add_ under `if use_res_connect`)
  // run inside the rewrite: what they write matters only where it is no value
  // the covered nodes make themselves (`outside`: what they read from before).
  auto in_member = [&](const Node* m) {
    for (const Node* u = m->owningBlock()->owningNode(); u; u = u->owningBlock()->owningNode())
      if (members.count(u)) return true;
    return false;
  };
  Watched outside;
  for (Node* n : order) {
    for (Value* v : n->inputs())
      if (!members.count(v->node())) {
        between.add(v);
        outside.add(v);
      }
    for (Value* o : n->outputs()) between.add(o);
  }
  {
    torch::jit::DepthFirstGraphNodeIterator it(graph_);
    for (Node* m = it.next(); m; m = it.next())
      if (in_member(m))
        for (Value* v : m->inputs())
          if (!members.count(v->node()) && !in_member(v->node()) &&
              !(v->node()->kind() == c10::prim::Param &&
                v->node()->owningBlock() != graph_->block()))
            outside.add(v);
  }
  for (Value* v : p.guarded) after.add(v);

  // Whether `m` may write a watched value: module state against module state
  // by attribute path; everything else by AliasDb (where attributes and graph
  // inputs are wildcards: conservative, and only those).
  // A tensor an op made (not a graph input, module state or a container's
  // element, through views and chunk pieces) is no module state: AliasDb puts
  // list elements among the wildcards, so a BatchNorm's num_batches_tracked.add_(1)
  // "may write" every piece of a chunk (RevNet's x1, x2) without this.
  // A value no module state can alias: made by a non-mutating op that returns
  // new tensors, or an element of the list such an op returns (memslim's
  // region and chain ops: AliasDb puts list elements among the wildcards).
  auto fresh = [](const Value* v) {
    const Node* p = SavedTensorAnalysis::storage_root(v)->node();
    if (p->kind() == c10::prim::ListUnpack) p = p->input(0)->node();
    if (p->kind() == c10::prim::Param || p->kind() == c10::prim::GetAttr || !p->blocks().empty())
      return false;
    const c10::FunctionSchema* s = p->maybeSchema();
    if (!s || s->is_mutable()) return false;
    for (const auto& r : s->returns())
      if (r.alias_info()) return false;
    return true;
  };
  auto writes = [&](Node* m, const Watched& w) -> const Value* {
    if (SavedTensorAnalysis::writes_nothing(m)) return nullptr;
    std::vector<const Value*> written = SavedTensorAnalysis::written_inputs(m);
    // BatchNorm's running stats: written (AliasDb knows, the schema does not say).
    // Here, not in SavedTensorAnalysis::written_inputs: there the covers' writes
    // count as removed by the rewrite, and a residual join keeps its norm's
    // running-stat writes (tried: fuse-residual-join then refused ResNet's tail).
    const std::string kind = m->kind().toQualString();
    if (written.empty() && (kind == "aten::batch_norm" || kind == "aten::instance_norm") &&
        m->inputs().size() > 4)
      for (size_t i : {3, 4})
        if (m->input(i)->type()->cast<c10::TensorType>()) written.push_back(m->input(i));
    if (written.empty()) { // no schema-declared write; prim ops that write (SetAttr...)
      // An If / Loop writes what its blocks' nodes write: the walk visits those.
      if (!m->blocks().empty()) return nullptr;
      if (w.plain.empty() || !alias().writesToAlias(m, w.plain)) return nullptr;
      for (const Value* v : w.plain)
        if (alias().writesToAlias(m, torch::jit::ValueSet{const_cast<Value*>(v)})) return v;
      return *w.plain.begin();
    }
    for (const Value* in : written) {
      const std::string path = module_state_path(in);
      for (const auto& [sp, v] : w.state)
        if (path.empty() ? alias().mayAlias(in, v) : same_or_nested(path, sp)) return v;
      for (const Value* v : w.plain)
        if (alias().mayAlias(in, v) && (path.empty() || !fresh(v))) {
          return v;
        }
    }
    return nullptr;
  };

  // A covered node writing in place (ConvNeXt's `result += input`) runs inside
  // the op, on every run and replay alike, as the nodes nested in covered ones
  // do: what it writes must be a value the covered nodes make themselves, not
  // one they read from outside (the block's input, a view of it, a parameter).
  for (Node* n : inside_writers)
    if (const Value* v = writes(n, outside))
      return std::string(n->kind().toQualString()) + " in it writes " + name_of(v) + " in place";

  torch::jit::DepthFirstGraphNodeIterator it(graph_);
  enum { Before, Inside, After } where = Before;
  for (Node* m = it.next(); m; m = it.next()) {
    if (m == first) {
      where = first == last ? After : Inside;
      continue;
    }
    if (m == last) {
      where = After;
      continue;
    }
    if (members.count(m)) continue;
    if (in_member(m)) {
      if (const Value* v = writes(m, outside))
        return std::string(m->kind().toQualString()) + " in it writes " + name_of(v) + " in place";
      continue;
    }
    if (where == Before) continue;
    if (where == Inside)
      if (const Value* v = writes(m, between))
        return std::string(m->kind().toQualString()) + " writes " + name_of(v) +
               " in place between its nodes";
    if (const Value* v = writes(m, after))
      return std::string(m->kind().toQualString()) + " later writes " + name_of(v) + " in place";
  }

  // An op the rewrite makes next to an existing op of the same kind on the
  // same input is one torch's CSE may merge with it. It will, when AliasDb sees
  // no write to either, and a write through a dropout that returned its input
  // is one it cannot see: the merged value would carry the write to the new
  // op's readers (long-fuzz seed 161800: x * sigmoid(x) -> silu(x) beside the
  // user's silu(x), whose eval-mode dropout's output mul_ wrote).
  // Across a grad-mode switch, CSE merges a value made under no_grad with one
  // made with grad (or the reverse): gradients then cross the block (long-fuzz
  // seed 401503: x * tanh(softplus(x)) under no_grad -> mish(x), the user's
  // mish(x) outside; x got a gradient eager never gives it).
  auto switch_between = [&](const Node* a, const Node* b) {
    if (a->owningBlock() != b->owningBlock()) { // conservatively: any switch at all
      torch::jit::DepthFirstGraphNodeIterator it(graph_);
      for (const Node* n = it.next(); n; n = it.next())
        if (switches_grad_mode(n->kind().toQualString())) return true;
      return false;
    }
    if (b->isBefore(a)) std::swap(a, b);
    for (const Node* m = a->next(); m != b; m = m->next())
      if (switches_grad_mode(m->kind().toQualString())) return true;
    return false;
  };
  for (const auto& [kind, x] : p.makes)
    for (const auto& use : x->uses()) {
      const Node* twin = use.user;
      if (twin->kind() != kind || use.offset != 0 || members.count(twin)) continue;
      if (switch_between(twin, first))
        return "torch's CSE may merge the new " + std::string(kind.toQualString()) +
               " with the one at " + name_of(twin->output(0)) +
               " across a with-block (grad mode, autocast)";
      for (const Value* o : twin->outputs())
        if (const Node* w = hidden_writer(o))
          return "torch's CSE may merge the new " + std::string(kind.toQualString()) +
                 " with the one at " + name_of(o) + ", which " + w->kind().toQualString() +
                 " writes in place through a dropout's undeclared alias";
    }

  // A value the executor may keep in a DifferentiableGraph with the covered
  // nodes must not be written in place once the chain has run: the rewrite may
  // move it into such a graph's kept values where the original graph did not
  // keep it (long-fuzz seed 104593: hardswish -> sigmoid -> hardswish ->
  // dropout_; with the first hardswish rewritten, sigmoid and the second
  // hardswish formed a graph keeping the output dropout_ then wrote).
  // Judged by structure, not AliasDb: tensors from tuples, lists, blocks, graph
  // inputs and module state are wildcards there, which any write to another
  // wildcard "may" touch (nn.TransformerEncoder's mask masked_fill_ would keep
  // every rewrite). A write counts when it writes a chain tensor itself, a view
  // of it, or what a dropout may have returned as it (module state by path).
  const std::vector<const Node*> chain = executor_chain(order, members, graph_);
  std::unordered_set<const Node*> in_chain(chain.begin(), chain.end());
  std::unordered_set<const Value*> roots;
  std::vector<std::string> root_paths;
  // A tensor a branch yields is its If's output too: a write to that output
  // after the If writes it (long-fuzz seed 226034: relu_ functionalized in
  // `if self.flag:`, whose relu -> softplus graph kept softplus's output, which
  // the branch yields and selu_ writes after the If).
  std::function<void(const Value*)> add_root = [&](const Value* v) {
    if (!v->type()->cast<c10::TensorType>()) return;
    const Value* r = SavedTensorAnalysis::storage_root(v);
    const std::string path = module_state_path(r);
    if (!path.empty()) {
      root_paths.push_back(path);
      return;
    }
    if (!roots.insert(r).second) return;
    for (const Value* x : {v, r})
      for (const auto& use : x->uses()) {
        const Node* owner = use.user->owningBlock()->owningNode();
        if (use.user->kind() == c10::prim::Return && owner && owner->kind() == c10::prim::If)
          add_root(owner->output(use.offset));
      }
  };
  // Only what such a graph's backward may read counts: the covered nodes'
  // tensors (the rewrite's own), the inputs a node's gradient reads
  // (SavedTensorAnalysis), aten::cat's tensors (its symbolic gradient keeps
  // them), and activations' inputs and outputs (symbolic gradients keep the
  // output of hardswish, leaky_relu, softplus where aten keeps the input). A
  // linear's output written later (Falcon's `mlp_output += attention_output`) is
  // read by no backward: not a reason to keep the gelu before it.
  for (const Node* n : chain) {
    const bool all = members.count(n) || activation_info(n->kind()) || clamping_activation(n);
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      const Value* v = n->inputs()[i];
      if (v->node()->kind() == c10::prim::ListConstruct) {
        if (all || n->kind() == c10::aten::cat ||
            SavedTensorAnalysis::keeps_input(n, i) /* a region's inputs */)
          for (const Value* e : v->node()->inputs()) add_root(e);
        continue;
      }
      if (all || SavedTensorAnalysis::keeps_input(n, i)) add_root(v);
    }
    if (all || SavedTensorAnalysis::keeps_output(n))
      for (const Value* v : n->outputs()) add_root(v);
  }
  torch::jit::DepthFirstGraphNodeIterator chain_it(graph_);
  bool started = false;
  for (Node* m = chain_it.next(); m; m = chain_it.next()) {
    started = started || in_chain.count(m);
    if (!started || members.count(m) || in_member(m)) continue; // in_member: runs inside the op
    for (const Value* w : SavedTensorAnalysis::written_inputs(m)) {
      const Value* r = SavedTensorAnalysis::storage_root(w);
      const std::string path = module_state_path(r);
      bool hit = path.empty() ? roots.count(r) > 0 : false;
      for (const auto& sp : root_paths) hit = hit || (!path.empty() && same_or_nested(path, sp));
      if (hit)
        return "TorchScript's executor may keep " + name_of(w) +
               " in a DifferentiableGraph with it, and " + m->kind().toQualString() +
               " writes it in place";
    }
  }
  if (const auto& why = hidden_alias_read()) return *why;
  if (const auto& why = executor_hazard()) return *why;
  return std::nullopt;
}

bool SafetyGate::submit(const Proposal& p) {
  if (auto why = refusal(p)) {
    remarks_.kept(pass_, p.site, *why, p.price);
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
