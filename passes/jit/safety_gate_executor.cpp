//===- safety_gate_executor.cpp - the gate's model of TorchScript's executor ===//
//
// What: what the SafetyGate knows of how TorchScript's executor cuts a graph
// into DifferentiableGraphs: the chain of nodes it may differentiate with a
// rewrite's nodes (executor_chain, read by the executor-chain-write rule), and
// the two graph-wide rules, hidden-alias (hidden_alias_read) and
// executor-hazard (executor_hazard), answered once per graph state.
// Why: these rules are about the executor, not about the rewrite: a rewrite
// anywhere changes the cuts, so they read the whole graph; kept apart from the
// per-proposal rules (safety_gate_rules.cpp) so that each file reads on its own.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/runtime/autodiff.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <unordered_map>

#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/safety_gate.h"
#include "memslim/jit/safety_gate_detail.h"
#include "memslim/jit/saved_tensor_analysis.h"

namespace memslim {

using gate_detail::name_of;
using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

namespace gate_detail {

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

} // namespace gate_detail

namespace {

using gate_detail::clamping_activation;
using gate_detail::executor_differentiates;

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

} // namespace

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

} // namespace memslim
