//===- safety_gate_rules.cpp - the SafetyGate's rules, one function each ---===//
//
// What: each rule of the TorchScript gate (core/gate_rules.h names them) as
// its own check, the table that lists them in the order they are checked, and
// SafetyGate::named_refusal, which walks the table: the first failing rule's
// reason is the refusal, with the rule's name. A rule checks the proposal once, or
// each covered node (in the proposal's order), or each node of the graph in
// depth-first order (the walk); consecutive rules of one kind run interleaved,
// node by node, so that the first failure is the one the graph meets first.
// Why: a refusal names the rule that made it, a rule reads on its own, and a
// new rule is one function and one row.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <functional>

#include "memslim/core/activation_table.h"
#include "memslim/fx/view_gate.h"
#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"
#include "memslim/jit/safety_gate_detail.h"
#include "memslim/jit/saved_tensor_analysis.h"

namespace memslim {

using gate_detail::name_of;
using torch::jit::AliasDb;
using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

namespace {

bool same_or_nested_path(const std::string& a, const std::string& b) {
  auto prefix = [](const std::string& p, const std::string& s) {
    return s.size() > p.size() && s.compare(0, p.size(), p) == 0 && s[p.size()] == '.';
  };
  return a == b || prefix(a, b) || prefix(b, a);
}

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

// A value no module state can alias: made by a non-mutating op that returns
// new tensors, or an element of the list such an op returns (memslim's region
// and chain ops: AliasDb puts list elements among the wildcards).
bool fresh_tensor(const Value* v) {
  const Node* p = SavedTensorAnalysis::storage_root(v)->node();
  if (p->kind() == c10::prim::ListUnpack) p = p->input(0)->node();
  if (p->kind() == c10::prim::Param || p->kind() == c10::prim::GetAttr || !p->blocks().empty())
    return false;
  const c10::FunctionSchema* s = p->maybeSchema();
  if (!s || s->is_mutable()) return false;
  for (const auto& r : s->returns())
    if (r.alias_info()) return false;
  return true;
}

// The node that surely made `v`'s storage, through views, chunk pieces, in-place
// writes and a list's elements; null where no one op surely did: an If's output
// (a branch may yield another tensor; storage_root follows one branch), or an
// op whose result may be its input though its schema declares none (type_as,
// which TorchScript's peephole folds to its input where the types match;
// dropouts storage_root follows already).
const Node* sole_maker(const Value* v) {
  bool branch = false;
  const Node* p = SavedTensorAnalysis::storage_root(v, nullptr, nullptr, &branch)->node();
  if (branch) return nullptr;
  if (p->kind() == c10::prim::ListUnpack) p = p->input(0)->node();
  if (p->kind() == c10::aten::type_as) return nullptr;
  return p;
}

// Whether `v` is surely a tensor one op of the graph made (fresh_tensor, one maker).
bool made_by_an_op(const Value* v) { return sole_maker(v) && fresh_tensor(v); }

// Whether `v`'s storage is surely one of the graph's inputs (not a loop's carried value).
bool graph_input(const Value* v) {
  const Node* p = sole_maker(v);
  return p && p == p->owningGraph()->param_node();
}

// How a covered node writes: not at all (or only what the rewrite removes),
// only module state a replaying rewrite replays, other values a replaying
// rewrite replays (judged by replayed-write), or in a way the rewrite cannot
// take over.
enum class CoveredWrite { None, StateOnly, Replayed, Refused };

CoveredWrite covered_write(const Proposal& p, const Node* n) {
  const c10::FunctionSchema* s = n->maybeSchema();
  if (!n->hasSideEffects() && !(s && s->is_mutable() && !p.removes_writes))
    return CoveredWrite::None;
  bool state_only = p.replays_writes && !n->hasSideEffects();
  for (const Value* w : SavedTensorAnalysis::written_inputs(n))
    state_only = state_only && !module_state_path(w).empty();
  if (state_only) return CoveredWrite::StateOnly;
  return p.replays_writes && !n->hasSideEffects() ? CoveredWrite::Replayed : CoveredWrite::Refused;
}

} // namespace

// What a write may not touch: between the covered nodes, anything they read
// or make; after the first, anything guarded. Module state goes by path.
struct GateWatched {
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
};

// What the rules of one named_refusal() share about its proposal, each
// computed on first use (by then the earlier rules have passed: the proposal
// covers nodes, all alive, in one block).
class GateCheck {
 public:
  GateCheck(SafetyGate& gate, const Proposal& proposal) : p(proposal), gate_(gate) {}
  const Proposal& p;

  const std::shared_ptr<Graph>& graph() const { return gate_.graph_; }
  bool alive(const Node* n) const { return gate_.alive(n); }
  bool live(const Value* v) { return gate_.live(v); }
  const Node* hidden_writer(const Value* v) { return gate_.hidden_writer(v); }
  const std::optional<std::string>& hidden_alias_read() { return gate_.hidden_alias_read(); }
  const std::optional<std::string>& executor_hazard() { return gate_.executor_hazard(); }

  // The covered nodes in graph order, and as a set.
  const std::vector<Node*>& order() {
    if (order_.empty()) {
      order_ = p.covers;
      std::sort(order_.begin(), order_.end(), [](Node* a, Node* b) { return a->isBefore(b); });
      members_.insert(order_.begin(), order_.end());
    }
    return order_;
  }
  const Node* first() { return order().front(); }
  const Node* last() { return order().back(); }
  const std::unordered_set<const Node*>& members() {
    order();
    return members_;
  }

  // Nodes nested in a covered If (a residual add_ under `if use_res_connect`)
  // run inside the rewrite.
  bool in_member(const Node* m) {
    for (const Node* u = m->owningBlock()->owningNode(); u; u = u->owningBlock()->owningNode())
      if (members().count(u)) return true;
    return false;
  }

  // Between the covered nodes: what they read or make; after the first: what
  // is guarded; `outside`: what the covered nodes and the nodes nested in them
  // read from before (what those may not write).
  const GateWatched& between() { return watched().between; }
  const GateWatched& after() { return watched().after; }
  const GateWatched& outside() { return watched().outside; }

  // A value of `w` that `m` may write, or null.
  const Value* writes(Node* m, const GateWatched& w);

 private:
  struct WatchedSets {
    GateWatched between, after, outside;
  };
  const WatchedSets& watched();

  SafetyGate& gate_;
  std::vector<Node*> order_;
  std::unordered_set<const Node*> members_;
  std::optional<WatchedSets> watched_;
};

const GateCheck::WatchedSets& GateCheck::watched() {
  if (watched_) return *watched_;
  watched_.emplace();
  WatchedSets& w = *watched_;
  for (Node* n : order()) {
    for (Value* v : n->inputs())
      if (!members().count(v->node())) {
        w.between.add(v);
        w.outside.add(v);
      }
    for (Value* o : n->outputs()) w.between.add(o);
  }
  torch::jit::DepthFirstGraphNodeIterator it(gate_.graph_);
  for (Node* m = it.next(); m; m = it.next())
    if (in_member(m))
      for (Value* v : m->inputs())
        if (!members().count(v->node()) && !in_member(v->node()) &&
            !(v->node()->kind() == c10::prim::Param &&
              v->node()->owningBlock() != gate_.graph_->block()))
          w.outside.add(v);
  for (Value* v : p.guarded) w.after.add(v);
  return w;
}

// Whether `m` may write a watched value: module state against module state by
// attribute path; everything else by AliasDb (where attributes and graph
// inputs are wildcards: conservative, and only those). A tensor an op made
// (not a graph input, module state or a container's element, through views and
// chunk pieces) is no module state, on either side of the write: AliasDb puts
// list elements among the wildcards, so a BatchNorm's
// num_batches_tracked.add_(1) "may write" every piece of a chunk (RevNet's x1,
// x2), and a write to a conv's output that a chunk later splits "may write"
// every parameter, without this.
const Value* GateCheck::writes(Node* m, const GateWatched& w) {
  if (SavedTensorAnalysis::writes_nothing(m)) return nullptr;
  AliasDb& alias = gate_.alias();
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
    if (w.plain.empty() || !alias.writesToAlias(m, w.plain)) return nullptr;
    for (const Value* v : w.plain)
      if (alias.writesToAlias(m, torch::jit::ValueSet{const_cast<Value*>(v)})) return v;
    return *w.plain.begin();
  }
  for (const Value* in : written) {
    const std::string path = module_state_path(in);
    // A written tensor an op made is no module state either: memcnn's downsampling
    // `out += residual` (out: a conv's output) writes no F / G weight of the chain
    // before it, though AliasDb counts `out` among the wildcards once a later chunk
    // takes it apart (list elements are wildcards) and every attribute read is one.
    const bool made = path.empty() && made_by_an_op(in);
    for (const auto& [sp, v] : w.state)
      if (path.empty() ? !made && alias.mayAlias(in, v) : same_or_nested_path(path, sp)) return v;
    // Two tensors made by two different ops (each through views, chunk pieces
    // and in-place writes back to its own maker) are two storages: memcnn's
    // `out += residual` writes none of the chain's inputs (chunk pieces of the
    // stem's output), though AliasDb's wildcards say each may be the other.
    // A graph input is no tensor an op of the graph made either.
    for (const Value* v : w.plain)
      if (alias.mayAlias(in, v) && (path.empty() || !fresh_tensor(v)) &&
          !(made && (made_by_an_op(v) || graph_input(v)) && sole_maker(in) != sole_maker(v)))
        return v;
  }
  return nullptr;
}

namespace {

using Why = std::optional<std::string>;

// Where the walk is: before the first covered node, between the first and the
// last, after the last (or the only one); `nested`: inside a covered If / Loop.
struct WalkAt {
  enum { Before, Inside, After } where;
  bool nested;
};

std::string kind_of(const Node* n) { return n->kind().toQualString(); }

//===--- rules checked once per proposal, or per covered node --------------===//

Why empty_proposal(GateCheck& c) {
  if (c.p.covers.empty()) return "the proposal covers no node (internal)";
  return std::nullopt;
}

Why stale_node(GateCheck& c) {
  for (const Node* n : c.p.covers)
    if (!c.alive(n)) return "an earlier rewrite changed it";
  return std::nullopt;
}

Why one_block(GateCheck& c) {
  const Block* block = c.p.covers.front()->owningBlock();
  for (const Node* n : c.p.covers)
    if (n->owningBlock() != block) return "its nodes lie in different blocks";
  return std::nullopt;
}

Why in_loop_body(GateCheck& c) {
  if (inside_loop(c.p.covers.front())) return "inside a loop (not analysed)";
  return std::nullopt;
}

Why no_schema(GateCheck& c, Node* n) {
  if (!n->maybeSchema() && !n->kind().is_prim())
    return kind_of(n) + " in it matches no registered schema";
  return std::nullopt;
}

// Rewrites take over functional code. A replaying rewrite's covered writes of
// other values than module state are judged by replayed-write, once `outside`
// is known.
Why writes_in_place(GateCheck& c, Node* n) {
  if (covered_write(c.p, n) == CoveredWrite::Refused)
    return kind_of(n) + " in it writes in place or has side effects";
  return std::nullopt;
}

// Why an in-place write the rewrite removes could be observed by someone other
// than the writer (the core's rule, core/view_gate.cpp, shared with the FX gate).
Why observable_write(GateCheck& c, Node* n) {
  if (!c.p.removes_writes) return std::nullopt;
  for (const Value* w : SavedTensorAnalysis::written_inputs(n))
    if (auto why = write_observable(JitGraphView(), JitGraphView::ref(w))) return why;
  return std::nullopt;
}

Why dead_code(GateCheck& c) {
  bool any_live = false;
  for (const Node* n : c.p.covers)
    for (const Value* o : n->outputs()) any_live = any_live || c.live(o);
  if (!any_live) return "its result is never used (dead code, left for TorchScript to delete)";
  return std::nullopt;
}

Why grad_mode_between(GateCheck& c) {
  const Node* last = c.last();
  for (const Node* m = c.first()->next(); m != last; m = m->next())
    if (switches_grad_mode(m->kind().toQualString()))
      return kind_of(m) + " (a with-block: grad mode, autocast) begins or ends between its nodes";
  return std::nullopt;
}

// A covered node writing in place (ConvNeXt's `result += input`) runs inside
// the op, on every run and replay alike, as the nodes nested in covered ones
// do: what it writes must be a value the covered nodes make themselves, not one
// they read from outside (the block's input, a view of it, a parameter).
Why replayed_write(GateCheck& c) {
  for (Node* n : c.p.covers)
    if (covered_write(c.p, n) == CoveredWrite::Replayed)
      if (const Value* v = c.writes(n, c.outside()))
        return kind_of(n) + " in it writes " + name_of(v) + " in place";
  return std::nullopt;
}

//===--- rules checked on the walk over the graph's nodes ------------------===//

// Nodes nested in a covered If run inside the rewrite: what they write matters
// only where it is no value the covered nodes make themselves.
Why nested_write(GateCheck& c, Node* m, WalkAt at) {
  if (!at.nested) return std::nullopt;
  if (const Value* v = c.writes(m, c.outside()))
    return kind_of(m) + " in it writes " + name_of(v) + " in place";
  return std::nullopt;
}

// The rewrite reads its inputs once, at one place.
Why write_between(GateCheck& c, Node* m, WalkAt at) {
  if (at.nested || at.where != WalkAt::Inside) return std::nullopt;
  if (const Value* v = c.writes(m, c.between()))
    return kind_of(m) + " writes " + name_of(v) + " in place between its nodes";
  return std::nullopt;
}

Why write_after_guarded(GateCheck& c, Node* m, WalkAt at) {
  if (at.nested || at.where == WalkAt::Before) return std::nullopt;
  if (const Value* v = c.writes(m, c.after()))
    return kind_of(m) + " later writes " + name_of(v) + " in place";
  return std::nullopt;
}

//===--- rules about torch's CSE and TorchScript's executor ----------------===//

// Whether a grad-mode switch lies between `a` and `b` (in different blocks,
// conservatively: any switch in the graph).
bool grad_switch_between(const std::shared_ptr<Graph>& graph, const Node* a, const Node* b) {
  if (a->owningBlock() != b->owningBlock()) {
    std::shared_ptr<Graph> g = graph;
    torch::jit::DepthFirstGraphNodeIterator it(g);
    for (const Node* n = it.next(); n; n = it.next())
      if (switches_grad_mode(n->kind().toQualString())) return true;
    return false;
  }
  if (b->isBefore(a)) std::swap(a, b);
  for (const Node* m = a->next(); m != b; m = m->next())
    if (switches_grad_mode(m->kind().toQualString())) return true;
  return false;
}

// An op the rewrite makes next to an existing op of the same kind on the same
// input is one torch's CSE may merge with it. It will, when AliasDb sees no
// write to either, and a write through a dropout that returned its input is
// one it cannot see: the merged value would carry the write to the new op's
// readers (long-fuzz seed 161800: x * sigmoid(x) -> silu(x) beside the user's
// silu(x), whose eval-mode dropout's output mul_ wrote).
// Across a grad-mode switch, CSE merges a value made under no_grad with one
// made with grad (or the reverse): gradients then cross the block (long-fuzz
// seed 401503: x * tanh(softplus(x)) under no_grad -> mish(x), the user's
// mish(x) outside; x got a gradient eager never gives it).
Why cse_twin(GateCheck& c) {
  for (const auto& [kind, x] : c.p.makes)
    for (const auto& use : x->uses()) {
      const Node* twin = use.user;
      if (twin->kind() != kind || use.offset != 0 || c.members().count(twin)) continue;
      if (grad_switch_between(c.graph(), twin, c.first()))
        return "torch's CSE may merge the new " + std::string(kind.toQualString()) +
               " with the one at " + name_of(twin->output(0)) +
               " across a with-block (grad mode, autocast)";
      for (const Value* o : twin->outputs())
        if (const Node* w = c.hidden_writer(o))
          return "torch's CSE may merge the new " + std::string(kind.toQualString()) +
                 " with the one at " + name_of(o) + ", which " + w->kind().toQualString() +
                 " writes in place through a dropout's undeclared alias";
    }
  return std::nullopt;
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
Why executor_chain_write(GateCheck& c) {
  const std::vector<const Node*> chain =
      gate_detail::executor_chain(c.order(), c.members(), c.graph());
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
    const bool all =
        c.members().count(n) || activation_info(n->kind()) || gate_detail::clamping_activation(n);
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
  std::shared_ptr<Graph> graph = c.graph();
  torch::jit::DepthFirstGraphNodeIterator chain_it(graph);
  bool started = false;
  for (Node* m = chain_it.next(); m; m = chain_it.next()) {
    started = started || in_chain.count(m);
    if (!started || c.members().count(m) || c.in_member(m)) continue; // runs inside the op
    for (const Value* w : SavedTensorAnalysis::written_inputs(m)) {
      const Value* r = SavedTensorAnalysis::storage_root(w);
      const std::string path = module_state_path(r);
      bool hit = path.empty() ? roots.count(r) > 0 : false;
      for (const auto& sp : root_paths)
        hit = hit || (!path.empty() && same_or_nested_path(path, sp));
      if (hit)
        return "TorchScript's executor may keep " + name_of(w) +
               " in a DifferentiableGraph with it, and " + m->kind().toQualString() +
               " writes it in place";
    }
  }
  return std::nullopt;
}

// Graph-wide (safety_gate_executor.cpp): every rewrite in such a graph is kept.
Why hidden_alias(GateCheck& c) { return c.hidden_alias_read(); }
Why executor_hazard(GateCheck& c) { return c.executor_hazard(); }

//===--- the table ---------------------------------------------------------===//

// One rule of the table: its check, run once per proposal, per covered node or
// per node of the walk (exactly one set).
struct ScriptRule {
  GateRule id;
  Why (*once)(GateCheck&) = nullptr;
  Why (*covered)(GateCheck&, Node*) = nullptr;
  Why (*walk)(GateCheck&, Node*, WalkAt) = nullptr;
  int scope() const { return once ? 0 : covered ? 1 : 2; }
};

// In the order they are checked (core/gate_rules.h lists them in this order).
const std::vector<ScriptRule>& script_rules() {
  using R = GateRule;
  static const std::vector<ScriptRule> rules = {
      {R::EmptyProposal, empty_proposal},
      {R::StaleNode, stale_node},
      {R::OneBlock, one_block},
      {R::InsideLoop, in_loop_body},
      {R::NoSchema, nullptr, no_schema},
      {R::WritesInPlace, nullptr, writes_in_place},
      {R::ObservableWrite, nullptr, observable_write},
      {R::DeadCode, dead_code},
      {R::GradModeBetween, grad_mode_between},
      {R::ReplayedWrite, replayed_write},
      {R::NestedWrite, nullptr, nullptr, nested_write},
      {R::WriteBetween, nullptr, nullptr, write_between},
      {R::WriteAfterGuarded, nullptr, nullptr, write_after_guarded},
      {R::CseTwin, cse_twin},
      {R::ExecutorChainWrite, executor_chain_write},
      {R::HiddenAlias, hidden_alias},
      {R::ExecutorHazard, executor_hazard},
  };
  return rules;
}

// Rules [begin, end) of the table, all checking each covered node: node by
// node, each node's rules in table order.
std::optional<Refusal> check_covered(GateCheck& c, size_t begin, size_t end) {
  const auto& rules = script_rules();
  for (Node* n : c.p.covers)
    for (size_t i = begin; i < end; ++i)
      if (auto why = rules[i].covered(c, n)) return refuse(rules[i].id, std::move(*why));
  return std::nullopt;
}

// Rules [begin, end) of the table, all checking the walk: the graph's nodes
// depth first, each node's rules in table order. The covered nodes themselves
// only move the walk on.
std::optional<Refusal> check_walk(GateCheck& c, size_t begin, size_t end) {
  const auto& rules = script_rules();
  const Node* first = c.first();
  const Node* last = c.last();
  std::shared_ptr<Graph> graph = c.graph();
  torch::jit::DepthFirstGraphNodeIterator it(graph);
  auto where = WalkAt::Before;
  for (Node* m = it.next(); m; m = it.next()) {
    if (m == first) {
      where = first == last ? WalkAt::After : WalkAt::Inside;
      continue;
    }
    if (m == last) {
      where = WalkAt::After;
      continue;
    }
    if (c.members().count(m)) continue;
    const WalkAt at{where, c.in_member(m)};
    for (size_t i = begin; i < end; ++i)
      if (auto why = rules[i].walk(c, m, at)) return refuse(rules[i].id, std::move(*why));
  }
  return std::nullopt;
}

} // namespace

std::vector<GateRule> SafetyGate::rules() {
  std::vector<GateRule> out;
  for (const ScriptRule& r : script_rules()) out.push_back(r.id);
  return out;
}

std::optional<std::string> SafetyGate::refusal(const Proposal& p) {
  std::optional<Refusal> r = named_refusal(p);
  if (!r) return std::nullopt;
  return std::move(r->reason);
}

std::optional<Refusal> SafetyGate::named_refusal(const Proposal& p) {
  GateCheck c(*this, p);
  const auto& rules = script_rules();
  for (size_t i = 0; i < rules.size();) {
    size_t end = i + 1; // a run of per-node rules of one scope goes together
    while (rules[i].scope() != 0 && end < rules.size() && rules[end].scope() == rules[i].scope())
      ++end;
    std::optional<Refusal> r;
    if (rules[i].once) {
      if (auto why = rules[i].once(c)) r = refuse(rules[i].id, std::move(*why));
    } else {
      r = rules[i].covered ? check_covered(c, i, end) : check_walk(c, i, end);
    }
    if (r) return r;
    i = end;
  }
  return std::nullopt;
}

} // namespace memslim
