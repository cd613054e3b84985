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
// Cost model: bytes the region's nodes keep today (beyond what nodes outside
// keep anyway) against the bytes of its inputs (free when others keep them),
// and the recompute work (full-size ops re-run in backward) against
// policy.max_added_work. Where the region holds a known activation, output-
// saving that activation alone is priced too and wins unless the region frees
// more. Boundaries: anything not in the elementwise table (control flow,
// random ops, in-place or out= ops, unknown ops) ends a region, as does a
// non-constant non-tensor operand. Each region is a proposal to the
// SafetyGate (regions in loops, and regions whose inputs or values are
// written in place between or after its nodes, are kept there).
// Placement: the region op goes where its last node was, or before the first
// outside node that consumes a region value (only when every region input is
// already defined there; otherwise the merge is refused).
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/passes/shape_analysis.h>
#include <torch/csrc/jit/runtime/graph_iterator.h>

#include <algorithm>
#include <memory>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "memslim/core/output_saving.h"
#include "memslim/passes/activation_table.h"
#include "memslim/passes/jit_graph_view.h"
#include "memslim/passes/pass.h"
#include "memslim/passes/safety_gate.h"
#include "memslim/passes/saved_tensor_analysis.h"

namespace memslim {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

namespace {

constexpr const char* kPass = "recompute-pointwise-regions";

// Functional elementwise aten ops (outputs broadcast from inputs, no state, no
// randomness). The aten activations of activation_table.def are here too: a
// formula around one is priced as a whole (and against output-saving that
// activation alone).
const std::unordered_set<std::string>& elementwise_ops() {
  static const std::unordered_set<std::string> ops = [] {
    std::unordered_set<std::string> s = {
        "aten::add",         "aten::sub",         "aten::rsub",        "aten::mul",
        "aten::div",         "aten::neg",         "aten::pow",         "aten::float_power",
        "aten::square",      "aten::reciprocal",  "aten::exp",         "aten::exp2",
        "aten::expm1",       "aten::log",         "aten::log1p",       "aten::log2",
        "aten::log10",       "aten::sqrt",        "aten::rsqrt",       "aten::abs",
        "aten::sign",        "aten::sgn",         "aten::sin",         "aten::cos",
        "aten::tan",         "aten::asin",        "aten::acos",        "aten::atan",
        "aten::atan2",       "aten::sinh",        "aten::cosh",        "aten::asinh",
        "aten::acosh",       "aten::atanh",       "aten::logit",       "aten::erf",
        "aten::erfc",        "aten::erfinv",      "aten::lgamma",      "aten::digamma",
        "aten::xlogy",       "aten::hypot",       "aten::where",       "aten::gt",
        "aten::lt",          "aten::ge",          "aten::le",          "aten::eq",
        "aten::ne",          "aten::logical_and", "aten::logical_or",  "aten::logical_not",
        "aten::logical_xor", "aten::clamp",       "aten::clamp_min",   "aten::clamp_max",
        "aten::clip",        "aten::minimum",     "aten::maximum",     "aten::fmin",
        "aten::fmax",        "aten::floor",       "aten::ceil",        "aten::round",
        "aten::trunc",       "aten::frac",        "aten::fmod",        "aten::remainder",
        "aten::masked_fill", "aten::nan_to_num",  "aten::lerp",        "aten::addcmul",
        "aten::addcdiv",     "aten::threshold",   "aten::relu6",       "aten::hardtanh",
        "aten::softshrink",  "aten::hardshrink",  "aten::log_sigmoid",
    };
#define MEMSLIM_OP(NAME, ...) s.insert("aten::" #NAME);
#include "memslim/kernels/activation_table.def"
    return s;
  }();
  return ops;
}

bool is_tensor(const Value* v) { return v->type()->cast<c10::TensorType>() != nullptr; }

bool is_scalar_constant(const Value* v) {
  return !is_tensor(v) && v->node()->kind() == c10::prim::Constant;
}

// Whether `n` may join a region.
bool is_candidate(const Node* n) {
  if (!n->blocks().empty() || n->outputs().size() != 1 || !is_tensor(n->output())) return false;
  if (!elementwise_ops().count(n->kind().toQualString())) return false;
  const c10::FunctionSchema* schema = n->maybeSchema();
  if (!schema || schema->is_mutable()) return false;  // out= overloads write an argument
  for (const Value* v : n->inputs())
    if (!is_tensor(v) && !is_scalar_constant(v)) return false;  // a computed int/float
  return true;
}

using NodeSet = std::unordered_set<const Node*>;

// Whether `m` (or any node nested in its blocks) reads a value some node of
// `producers` defines.
bool reads_from(const Node* m, const NodeSet& producers) {
  for (const Value* v : m->inputs())
    if (producers.count(v->node())) return true;
  for (const Block* b : m->blocks()) {
    for (const Node* inner : b->nodes())
      if (reads_from(inner, producers)) return true;
    for (const Value* v : b->outputs())
      if (producers.count(v->node())) return true;
  }
  return false;
}

// Nodes sorted by position in their (common) block.
void sort_by_position(std::vector<Node*>& nodes) {
  std::sort(nodes.begin(), nodes.end(), [](Node* a, Node* b) { return a->isBefore(b); });
}

// Where the region op must go: before the first node outside the region, in
// the region's span, that (transitively) consumes a region value; else in
// place of the last region node. nullptr when some region input is defined
// only after that point (no valid place without moving other nodes).
Node* insertion_point(const std::vector<Node*>& nodes) {
  NodeSet members(nodes.begin(), nodes.end());
  NodeSet tainted = members;
  Node* point = nodes.back();
  for (Node* m = nodes.front()->next(); m != nodes.back(); m = m->next()) {
    if (members.count(m)) continue;
    if (reads_from(m, tainted)) {
      point = m;
      break;
    }
  }
  for (Node* n : nodes)
    for (Value* v : n->inputs())
      if (!members.count(v->node()) && !is_scalar_constant(v) &&
          v->node()->owningBlock() == point->owningBlock() && !v->node()->isBefore(point))
        return nullptr;
  return point;
}

// Which values may require grad in training: floating tensors that are graph
// inputs, module parameters (not buffers: the class type knows), or computed
// from such by a non-prim op; anything else from prim nodes (lists, If
// outputs) conservatively may. Refines what a region's nodes keep today:
// autograd records nothing for an op none of whose inputs requires grad, and
// mul keeps an operand only for the other operand's gradient (FracAct's
// `acc * pow(-1, n)` with a buffer n keeps nothing).
class MayRequireGrad {
 public:
  explicit MayRequireGrad(const std::shared_ptr<Graph>& g) {
    for (Value* v : g->inputs()) grad_[v] = floating(v);
    visit(g->block());
  }
  bool operator()(const Value* v) const {
    auto it = grad_.find(v);
    return it == grad_.end() ? floating(v) : it->second;
  }

 private:
  static bool floating(const Value* v) {
    auto t = v->type()->cast<c10::TensorType>();
    if (!t) return false;
    return !t->scalarType() || c10::isFloatingType(*t->scalarType()) ||
           c10::isComplexType(*t->scalarType());
  }
  void visit(Block* b) {
    for (Node* n : b->nodes()) {
      for (Block* inner : n->blocks()) {
        for (Value* v : inner->inputs()) grad_[v] = floating(v);
        visit(inner);
      }
      bool any = false;
      for (Value* v : n->inputs()) any = any || (*this)(v);
      for (Value* o : n->outputs()) {
        bool g = floating(o);
        if (n->kind() == c10::prim::Constant) {
          g = false;  // a tensor constant (traced graphs) is not a leaf that requires grad
        } else if (g && n->kind() == c10::prim::GetAttr) {
          auto cls = n->input(0)->type()->cast<c10::ClassType>();
          auto slot = cls ? cls->findAttributeSlot(n->s(c10::attr::name)) : std::nullopt;
          g = !cls || !slot || cls->is_parameter(*slot);
        } else if (g && !n->kind().is_prim()) {
          g = any;
        }
        grad_[o] = g;
      }
    }
  }
  std::unordered_map<const Value*, bool> grad_;
};

// SavedTensorAnalysis's rule for a region node, refined by who requires grad.
bool region_keeps_input(const Node* n, size_t i, const MayRequireGrad& grad) {
  if (!is_tensor(n->input(i))) return false;
  bool any = false;
  for (const Value* v : n->inputs()) any = any || grad(v);
  if (!any) return false;
  const c10::Symbol k = n->kind();
  if (k == c10::aten::mul && n->inputs().size() >= 2 && i < 2) return grad(n->input(1 - i));
  if (k == c10::aten::div && n->inputs().size() >= 2 && i == 0) return grad(n->input(1));
  return SavedTensorAnalysis::keeps_input(n, i);
}

bool region_keeps_output(const Node* n, const MayRequireGrad& grad) {
  bool any = false;
  for (const Value* v : n->inputs()) any = any || grad(v);
  if (!any) return false;
  if (n->kind() == c10::aten::pow && n->inputs().size() > 1) return grad(n->input(1));
  return SavedTensorAnalysis::keeps_output(n);
}

struct Region {
  std::vector<Node*> nodes;      // in block order
  std::vector<Value*> inputs;    // external tensor inputs, in order of first use
  std::vector<Value*> outputs;   // values used outside the region
  int64_t before = 0, after = 0; // bytes its nodes keep today / its inputs would keep
  int64_t kept_values = 0;       // how many values `before` counts
  int64_t full_size_ops = 0;     // ops with more than one element (recomputed in backward)
  int64_t alone = 0;             // what output-saving its known activations frees
  std::string acts;              // those activations
  bool assumed = false;
  bool unknown = false;
  int64_t freed() const { return before - after; }
};

void describe_values(Region& r) {
  r.inputs.clear();
  r.outputs.clear();
  NodeSet members(r.nodes.begin(), r.nodes.end());
  std::unordered_set<const Value*> seen;
  for (Node* n : r.nodes) {
    for (Value* v : n->inputs())
      if (!members.count(v->node()) && is_tensor(v) && seen.insert(v).second) r.inputs.push_back(v);
    for (Value* o : n->outputs())
      for (const auto& use : o->uses())
        if (!members.count(use.user)) {
          r.outputs.push_back(o);
          break;
        }
  }
  // Graph outputs are uses by the block's return node, which is outside.
}

void price(Region& r, const CostPolicy& policy, const MayRequireGrad& grad) {
  NodeSet members(r.nodes.begin(), r.nodes.end());
  auto bytes_of = [&](const Value* v) -> int64_t {
    if (auto b = SavedTensorAnalysis::bytes(v)) return *b;
    if (policy.assume_numel > 0) {
      r.assumed = true;
      return 4 * policy.assume_numel;
    }
    r.unknown = true;
    return 0;
  };
  std::vector<const Value*> kept;
  std::unordered_set<const Value*> seen;
  for (Node* n : r.nodes) {
    for (size_t i = 0; i < n->inputs().size(); ++i)
      if (region_keeps_input(n, i, grad) && seen.insert(n->input(i)).second)
        kept.push_back(n->input(i));
    if (region_keeps_output(n, grad) && seen.insert(n->output()).second)
      kept.push_back(n->output());
    auto numel = SavedTensorAnalysis::numel(n->output());
    if (!numel || *numel > 1) ++r.full_size_ops;
  }
  for (const Value* v : kept)
    if (!SavedTensorAnalysis::kept_by_other(v, members)) {
      r.before += bytes_of(v);
      ++r.kept_values;
    }
  // The region op keeps its inputs when any of them requires grad.
  bool any = false;
  for (const Value* v : r.inputs) any = any || grad(v);
  for (const Value* v : r.inputs)
    if (any && !SavedTensorAnalysis::kept_by_other(v, members)) r.after += bytes_of(v);
}

// Why backward may not run through `v`'s history, or "": a node the region
// does not cover wrote `v`'s storage in place after a node kept it for
// backward (a sigmoid keeping its output, addcmul_ keeping its operands), so
// differentiating into that history fails. The original program trains only
// because its loss never reaches there; one region op joins its outputs'
// histories, and a live output then sends backward into every input's
// history (long-fuzz seed 144972: rsqrt's output written by addcmul_, read by
// a where() nobody differentiates, in one region with a live tanh).
std::string poisoned_history(const Value* v, const Region& r,
                             const std::shared_ptr<torch::jit::Graph>& graph) {
  const std::unordered_set<const Node*> members(r.nodes.begin(), r.nodes.end());
  const Value* root = SavedTensorAnalysis::storage_root(v);
  auto aliases_root = [&](const Value* x) {
    return x->type()->cast<c10::TensorType>() && SavedTensorAnalysis::storage_root(x) == root;
  };
  std::shared_ptr<torch::jit::Graph> g = graph;
  torch::jit::DepthFirstGraphNodeIterator it(g);
  const Node* keeper = nullptr;
  if (root->node()->kind() != c10::prim::Param && SavedTensorAnalysis::keeps_output(root->node()))
    keeper = root->node();
  for (Node* n = it.next(); n; n = it.next()) {
    if (members.count(n)) continue;
    const auto written = SavedTensorAnalysis::written_inputs(n);
    bool writes_root = false;
    for (const Value* w : written) writes_root = writes_root || aliases_root(w);
    // A node may keep what it then writes (addcmul_(v, v, v) keeps its operands).
    const c10::FunctionSchema* schema = n->maybeSchema();
    for (size_t i = 0; i < n->inputs().size() && !keeper; ++i) {
      const bool written_arg = schema && i < schema->arguments().size() &&
                               schema->arguments()[i].alias_info() &&
                               schema->arguments()[i].alias_info()->isWrite();
      if (!written_arg && aliases_root(n->input(i)) && SavedTensorAnalysis::keeps_input(n, i))
        keeper = n;
    }
    if (writes_root && keeper)
      return "backward through %" + v->debugName() + "'s history would fail (" +
             keeper->kind().toQualString() + " keeps it, " + n->kind().toQualString() +
             " writes it in place), and one region op would reach it";
  }
  return "";
}

std::string where(const Region& r) {
  const Value* v = r.outputs.empty() ? r.nodes.back()->output() : r.outputs.back();
  std::ostringstream s;
  s << "region of " << r.nodes.size() << (r.nodes.size() == 1 ? " op" : " ops") << " at %"
    << v->debugName();
  return s.str();
}

// Regions of one block, grown greedily in program order: a candidate joins the
// region of each candidate producing one of its inputs when the merged region
// still has a valid place (insertion_point).
std::vector<std::vector<Node*>> form_regions(Block* b) {
  std::unordered_map<const Node*, size_t> region_of;
  std::vector<std::vector<Node*>> regions;
  for (Node* n : b->nodes()) {
    if (!is_candidate(n)) continue;
    size_t target = regions.size();
    regions.push_back({n});
    region_of[n] = target;
    std::set<size_t> producers;
    for (const Value* v : n->inputs()) {
      auto it = region_of.find(v->node());
      if (it != region_of.end() && it->second != target) producers.insert(it->second);
    }
    for (size_t id : producers) {
      std::vector<Node*> merged = regions[id];
      merged.insert(merged.end(), regions[target].begin(), regions[target].end());
      sort_by_position(merged);
      if (!insertion_point(merged)) continue;
      for (Node* m : regions[target]) region_of[m] = id;
      regions[id] = std::move(merged);
      regions[target].clear();
      target = id;
    }
  }
  regions.erase(std::remove_if(regions.begin(), regions.end(),
                               [](const std::vector<Node*>& r) { return r.empty(); }),
                regions.end());
  return regions;
}

void collect_blocks(Block* b, std::vector<Block*>& out) {
  out.push_back(b);
  for (Node* n : b->nodes())
    for (Block* inner : n->blocks()) collect_blocks(inner, out);
}

// Replaces the region by ListConstruct -> recompute_region -> ListUnpack.
// Returns "" or, when the region's text would not parse back, the parser's
// complaint (the graph is then left unchanged).
std::string rewrite(Graph& g, const Region& r, Node* point) {
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
    Node* c = sub->appendNode(sub->createClone(v->node(), [](Value*) -> Value* { return nullptr; }));
    env[v] = c->output();
    return c->output();
  };
  for (Node* n : r.nodes) {
    Node* c = sub->appendNode(sub->createClone(n, map));
    // Traced graphs carry module scopes, which the printer writes and parseIR
    // cannot read back: the region's text drops them.
    c->setScope(c10::make_intrusive<torch::jit::Scope>());
    for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = c->output(i);
  }
  for (Value* o : r.outputs) sub->registerOutput(env.at(o));
  torch::jit::EraseShapeInformation(sub);
  const std::string ir = sub->toString(/*print_source_locations=*/false);
  try {  // the op parses this text at run time: check now, keep the region if it cannot
    auto check = std::make_shared<Graph>();
    torch::jit::parseIR(ir, check.get());
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    return msg.substr(0, msg.find('\n'));
  }

  torch::jit::WithInsertPoint guard(point);
  Value* list = g.insertNode(g.createList(c10::TensorType::get(), r.inputs))->output();
  Value* text = g.insertConstant(c10::IValue(ir));
  Node* op = g.insertNode(g.create(c10::Symbol::fromQualString("memslim::recompute_region"),
                                   {list, text}, 1));
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
  std::vector<Block*> blocks;
  collect_blocks(g->block(), blocks);
  std::vector<Region> regions;
  for (Block* b : blocks)
    for (auto& nodes : form_regions(b)) {
      regions.emplace_back();
      regions.back().nodes = std::move(nodes);
    }
  // Rebuilt after every applied rewrite: its map is keyed by Value pointers,
  // and a destroyed value's address may be reused by a new one.
  std::unique_ptr<MayRequireGrad> grad;
  int grad_at = -1;
  // One region at a time, described, priced and placed on the graph as the
  // earlier rewrites left it: a region reading another's outputs gets its
  // inputs from that region's op, and what it keeps is priced against what
  // that op keeps (ResMLP's chained residual regions each looked free while
  // the graph was unrewritten: predicted 24 x 49,152 B, measured 2,048 B each).
  for (Region& r : regions) {
    bool alive = true;
    for (Node* n : r.nodes) alive = alive && ctx.gate->alive(n);
    if (!alive) continue;  // cannot happen (regions are disjoint); never touch a dead node
    describe_values(r);
    if (grad_at != ctx.gate->applied()) {
      grad = std::make_unique<MayRequireGrad>(g);
      grad_at = ctx.gate->applied();
    }
    price(r, ctx.policy, *grad);
    if (r.before == 0 && !r.unknown) continue;  // keeps nothing today: nothing to win
    const Price priced =
        r.unknown ? Price{} : Price{r.before, r.after, static_cast<double>(r.full_size_ops)};
    std::ostringstream kept;
    // The known activations in it, and what output-saving them alone would free.
    for (const Node* n : r.nodes) {
      auto info = activation_info(n->kind());
      if (!info || n->kind() != info->aten) continue;
      if (auto p = output_saving_price(JitGraphView(), JitGraphView::ref(n), ctx.policy))
        r.alone += std::max<int64_t>(0, p->freed());
      r.acts += (r.acts.empty() ? "" : ", ") + std::string(n->kind().toQualString());
    }
    Node* point = nullptr;
    if (r.unknown) {
      kept << "unknown shape (give input shapes)";
    } else if (!r.acts.empty() && r.freed() <= r.alone) {
      kept << "left to output-saving-activations (" << r.acts << " alone frees " << r.alone
           << " B; recomputing the region would free " << r.freed() << " B)";
    } else if (r.freed() < ctx.policy.min_bytes) {
      kept << "frees " << r.freed() << " B, below the " << ctx.policy.min_bytes
           << " B minimum (its inputs cost " << r.after << " B)";
    } else if (r.full_size_ops == 0) {
      kept << "only 0-dim values (nothing worth recomputing)";
    } else if (ctx.policy.max_added_work >= 0 && r.full_size_ops > ctx.policy.max_added_work) {
      kept << "recomputes " << r.full_size_ops << " full-size ops in backward, above the maximum "
           << ctx.policy.max_added_work;
    } else if (!(point = insertion_point(r.nodes))) {
      kept << "an input is defined after a consumer of its outputs (no valid place)";
    } else {
      for (const Value* in : r.inputs)
        if (const std::string why = poisoned_history(in, r, g); !why.empty()) {
          kept << why;
          point = nullptr;
          break;
        }
    }
    if (!point) {
      ctx.remarks.kept(kPass, where(r), kept.str(), priced);
      continue;
    }
    std::ostringstream why;
    why << "rewrote " << where(r) << ": keeps its " << r.inputs.size() << " input"
        << (r.inputs.size() == 1 ? "" : "s") << " instead of " << r.kept_values
        << " intermediate values, frees " << r.freed() << " B (" << r.before << " -> " << r.after
        << "), recomputes " << r.full_size_ops << " full-size ops in backward"
        << (r.assumed ? " (assumed shapes)" : "");
    if (!r.acts.empty())
      why << "; more than output-saving " << r.acts << " alone (" << r.alone << " B)";
    Proposal prop;
    prop.site = where(r);
    prop.covers = r.nodes;
    // The op keeps its inputs; the original nodes kept their intermediates.
    prop.guarded = r.inputs;
    for (Node* n : r.nodes) prop.guarded.push_back(n->output());
    prop.apply = [&g, &r, point]() {
      const std::string failed = rewrite(*g, r, point);
      return failed.empty() ? failed : "its graph text does not parse back (" + failed + ")";
    };
    prop.rewrote = why.str();
    prop.price = priced;
    ctx.gate->submit(prop);
  }
}

} // namespace memslim
