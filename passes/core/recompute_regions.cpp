//===- recompute_regions.cpp - elementwise regions kept as their inputs -----===//
//
// The decision of recompute-pointwise-regions over a GraphView (header: what
// and why). Cost model: bytes the region's nodes keep today (beyond what
// nodes outside keep anyway) against the bytes of its inputs (free when others
// keep them), and the recompute work (full-size ops re-run in backward)
// against policy.max_added_work. Where the region holds a known activation,
// output-saving that activation alone is priced too and wins unless the
// region frees more. Boundaries: anything not in the elementwise table
// (control flow, random ops, in-place or out= ops, unknown ops) ends a region,
// as does a non-constant non-tensor operand.
// Placement: the op goes just before the first node outside the region, in
// the region's span, that consumes a region value, else just before the
// region's last node (only when every region input is defined there;
// otherwise a merge is refused and a region kept).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/recompute_regions.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <unordered_set>

#include "memslim/core/activation_table.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {

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

using NodeSet = saved::NodeSet;

// Program positions, and which grad-mode span each node runs in (how many
// mode switches come before it): a region and the place of its op stay in one
// span, or the op would run a no_grad block's ops with grad, or the region's
// ops without it (review finding, 2026-11-24).
struct Positions {
  std::unordered_map<const void*, size_t> at, span;
  size_t pos(NodeRef n) const { return at.at(n.p); }
};

Positions positions(const GraphView& g) {
  Positions p;
  const auto order = g.nodes();
  size_t span = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (switches_grad_mode(g.kind(order[i]))) ++span;
    p.at[order[i].p] = i;
    p.span[order[i].p] = span;
  }
  return p;
}

// `n` itself, or the node holding it, that sits in the block owned by `owner`
// (null: `n` is not inside that block).
NodeRef ancestor_in(const GraphView& g, NodeRef n, NodeRef owner) {
  for (int guard = 0; n && guard < 10000; ++guard) {
    if (g.owner(n) == owner) return n;
    n = g.owner(n);
  }
  return NodeRef{};
}

// Where the op must go (just before it): the first node outside the region,
// in the region's span, that consumes a region value (directly or inside one
// of its blocks); else the region's last node. Null when some region input is
// defined only at or after that point (no valid place without moving nodes).
NodeRef insertion_point(const GraphView& g, const std::vector<NodeRef>& nodes,
                        const Positions& pos) {
  const NodeSet members(nodes.begin(), nodes.end());
  const NodeRef owner = g.owner(nodes.front());
  const size_t front = pos.pos(nodes.front()), back = pos.pos(nodes.back());
  NodeRef point = nodes.back();
  size_t best = back;
  for (NodeRef n : nodes)
    for (size_t o = 0; o < g.num_outputs(n); ++o)
      for (const Use& u : g.uses(g.output(n, o))) {
        if (members.count(u.user)) continue;
        const NodeRef a = ancestor_in(g, u.user, owner);
        if (!a) continue;
        auto it = pos.at.find(a.p);
        if (it == pos.at.end()) continue; // a block's return: after everything
        if (it->second > front && it->second < best) {
          best = it->second;
          point = a;
        }
      }
  for (NodeRef n : nodes)
    for (size_t i = 0; i < g.num_inputs(n); ++i) {
      const ValueRef v = g.input(n, i);
      if (is_region_constant(g, v) || g.is_input(v)) continue;
      const NodeRef p = g.producer(v);
      if (!p || members.count(p) || g.owner(p) != owner) continue;
      auto it = pos.at.find(p.p);
      if (it != pos.at.end() && it->second >= best) return NodeRef{};
    }
  // The op runs where it is placed: in the region's grad mode.
  auto span = pos.span.find(point.p);
  if (span == pos.span.end() || span->second != pos.span.at(nodes.front().p)) return NodeRef{};
  return point;
}

void sort_by_position(std::vector<NodeRef>& nodes, const Positions& pos) {
  std::sort(nodes.begin(), nodes.end(),
            [&](NodeRef a, NodeRef b) { return pos.pos(a) < pos.pos(b); });
}

// The saved-tensor rule for a region node, refined by who requires grad.
bool region_keeps_input(const GraphView& g, NodeRef n, size_t i, const MayRequireGrad& grad) {
  if (!g.is_tensor(g.input(n, i))) return false;
  bool any = false;
  for (size_t k = 0; k < g.num_inputs(n); ++k) any = any || grad(g.input(n, k));
  if (!any) return false;
  const std::string k = g.kind(n);
  if (k == "aten::mul" && g.num_inputs(n) >= 2 && i < 2) return grad(g.input(n, 1 - i));
  if (k == "aten::div" && g.num_inputs(n) >= 2 && i == 0) return grad(g.input(n, 1));
  return saved::keeps_input(g, n, i);
}

bool region_keeps_output(const GraphView& g, NodeRef n, const MayRequireGrad& grad) {
  bool any = false;
  for (size_t k = 0; k < g.num_inputs(n); ++k) any = any || grad(g.input(n, k));
  if (!any) return false;
  if (g.kind(n) == "aten::pow" && g.num_inputs(n) > 1) return grad(g.input(n, 1));
  return saved::keeps_output(g, n);
}

void describe_values(const GraphView& g, Region& r) {
  r.inputs.clear();
  r.outputs.clear();
  const NodeSet members(r.nodes.begin(), r.nodes.end());
  std::unordered_set<const void*> seen;
  for (NodeRef n : r.nodes) {
    for (size_t i = 0; i < g.num_inputs(n); ++i) {
      const ValueRef v = g.input(n, i);
      if (!members.count(g.producer(v)) && g.is_tensor(v) && seen.insert(v.p).second)
        r.inputs.push_back(v);
    }
    // Graph outputs are uses by the return node, which is outside.
    for (size_t o = 0; o < g.num_outputs(n); ++o) {
      const ValueRef v = g.output(n, o);
      for (const Use& u : g.uses(v))
        if (!members.count(u.user)) {
          r.outputs.push_back(v);
          break;
        }
    }
  }
}

void price(const GraphView& g, Region& r, const CostPolicy& policy, const MayRequireGrad& grad) {
  const NodeSet members(r.nodes.begin(), r.nodes.end());
  auto bytes_of = [&](ValueRef v) -> int64_t {
    if (auto b = g.bytes(v)) return *b;
    if (policy.assume_numel > 0) {
      r.assumed = true;
      return 4 * policy.assume_numel;
    }
    r.unknown = true;
    return 0;
  };
  std::vector<ValueRef> kept;
  std::unordered_set<const void*> seen;
  for (NodeRef n : r.nodes) {
    for (size_t i = 0; i < g.num_inputs(n); ++i)
      if (region_keeps_input(g, n, i, grad) && seen.insert(g.input(n, i).p).second)
        kept.push_back(g.input(n, i));
    if (region_keeps_output(g, n, grad) && seen.insert(g.output(n, 0).p).second)
      kept.push_back(g.output(n, 0));
    const auto numel = g.numel(g.output(n, 0));
    if (!numel || *numel > 1) ++r.full_size_ops;
  }
  for (ValueRef v : kept)
    if (!saved::kept_by_other(g, v, members)) {
      r.before += bytes_of(v);
      ++r.kept_values;
    }
  // The region op keeps its inputs when any of them requires grad.
  bool any = false;
  for (ValueRef v : r.inputs) any = any || grad(v);
  for (ValueRef v : r.inputs)
    if (any && !saved::kept_by_other(g, v, members)) r.after += bytes_of(v);
}

// Why backward may not run through `v`'s history, or "": a node the region
// does not cover wrote `v`'s storage in place after a node kept it for
// backward (a sigmoid keeping its output, addcmul_ keeping its operands), so
// differentiating into that history fails. The original program trains only
// because its loss never reaches there; one region op joins its outputs'
// histories, and a live output then sends backward into every input's
// history (long-fuzz seed 144972: rsqrt's output written by addcmul_, read by
// a where() nobody differentiates, in one region with a live tanh).
std::string poisoned_history(const GraphView& g, ValueRef v, const Region& r,
                             const StorageFacts& storage) {
  const NodeSet members(r.nodes.begin(), r.nodes.end());
  const ValueRef root = storage.root(v);
  auto aliases_root = [&](ValueRef x) { return g.is_tensor(x) && storage.root(x) == root; };
  NodeRef keeper;
  if (!g.is_input(root) && saved::keeps_output(g, g.producer(root))) keeper = g.producer(root);
  for (NodeRef n : g.nodes()) {
    if (members.count(n)) continue;
    bool writes_root = false;
    for (ValueRef w : storage.written(n)) writes_root = writes_root || aliases_root(w);
    // A node may keep what it then writes (addcmul_(v, v, v) keeps its operands).
    const c10::FunctionSchema* schema = g.schema(n);
    for (size_t i = 0; i < g.num_inputs(n) && !keeper; ++i) {
      const bool written_arg = schema && i < schema->arguments().size() &&
                               schema->arguments()[i].alias_info() &&
                               schema->arguments()[i].alias_info()->isWrite();
      if (!written_arg && aliases_root(g.input(n, i)) && saved::keeps_input(g, n, i)) keeper = n;
    }
    if (writes_root && keeper)
      return "backward through " + g.name(v) + "'s history would fail (" + g.kind(keeper) +
             " keeps it, " + g.kind(n) + " writes it in place), and one region op would reach it";
  }
  return "";
}

std::string where(const GraphView& g, const Region& r) {
  const ValueRef v = r.outputs.empty() ? g.output(r.nodes.back(), 0) : r.outputs.back();
  std::ostringstream s;
  s << "region of " << r.nodes.size() << (r.nodes.size() == 1 ? " op" : " ops") << " at "
    << g.name(v);
  return s.str();
}

} // namespace

MayRequireGrad::MayRequireGrad(const GraphView& g) : g_(g) {
  for (NodeRef n : g.nodes()) {
    bool any = false;
    for (size_t i = 0; i < g.num_inputs(n); ++i) any = any || (*this)(g.input(n, i));
    const std::string k = g.kind(n);
    // Containers carry their elements' answer: a tuple or list of tensors may
    // require grad when an element may (LLaMA's rotary (cos, sin) tuple,
    // unpacked in every layer, needs none).
    if (k == "prim::TupleConstruct" || k == "prim::ListConstruct") {
      for (size_t o = 0; o < g.num_outputs(n); ++o) grad_[g.output(n, o).p] = any;
      continue;
    }
    if (k == "prim::TupleUnpack" || k == "prim::ListUnpack" || k == "prim::TupleIndex" ||
        k == "aten::__getitem__") {
      // A container an op made (chunk's pieces, a region's outputs): as opaque as before.
      const NodeRef p = g.num_inputs(n) > 0 ? g.producer(g.input(n, 0)) : NodeRef{};
      const bool built =
          p && (g.kind(p) == "prim::TupleConstruct" || g.kind(p) == "prim::ListConstruct");
      const bool from = !built || (*this)(g.input(n, 0));
      for (size_t o = 0; o < g.num_outputs(n); ++o) {
        const ValueRef v = g.output(n, o);
        grad_[v.p] = floating(v) && from;
      }
      continue;
    }
    const bool opaque = k.rfind("prim::", 0) == 0 || k.rfind("python::", 0) == 0;
    for (size_t o = 0; o < g.num_outputs(n); ++o) {
      const ValueRef v = g.output(n, o);
      bool r = floating(v) && (opaque || any);
      if (auto known = g.requires_grad(v)) r = *known;
      grad_[v.p] = r;
    }
  }
}

bool MayRequireGrad::floating(ValueRef v) const {
  if (!g_.is_tensor(v)) return false;
  const auto t = g_.dtype(v);
  return !t || c10::isFloatingType(*t) || c10::isComplexType(*t);
}

bool MayRequireGrad::operator()(ValueRef v) const {
  auto it = grad_.find(v.p);
  if (it != grad_.end()) return it->second;
  if (auto known = g_.requires_grad(v)) return *known;
  return floating(v); // a graph input (TorchScript's have no Param node in nodes())
}

bool is_region_constant(const GraphView& g, ValueRef v) {
  if (g.is_tensor(v)) return false;
  const auto c = g.constant(v);
  if (!c) return false;
  const NodeRef p = g.producer(v);
  if (p && g.num_inputs(p) != 0) return false; // a list built from constants
  // NaN prints as `nan`, which the IR parser reads back as a type attribute:
  // the op failed on its first run (review finding, 2026-11-24).
  if (c->isDouble() && std::isnan(c->toDouble())) return false;
  return c->isInt() || c->isDouble() || c->isBool() || c->isNone() || c->isString();
}

bool is_region_candidate(const GraphView& g, NodeRef n) {
  if (g.num_outputs(n) != 1 || !g.is_tensor(g.output(n, 0))) return false;
  if (!elementwise_ops().count(g.kind(n))) return false;
  const c10::FunctionSchema* schema = g.schema(n);
  if (!schema || schema->is_mutable()) return false; // out= overloads write an argument
  for (size_t i = 0; i < g.num_inputs(n); ++i)
    if (!g.is_tensor(g.input(n, i)) && !is_region_constant(g, g.input(n, i)))
      return false; // a computed int/float
  return true;
}

std::vector<std::vector<NodeRef>> form_regions(const GraphView& g) {
  const std::vector<NodeRef> order = g.nodes();
  const Positions pos = positions(g);
  std::unordered_map<const void*, size_t> region_of;
  std::vector<std::vector<NodeRef>> regions;
  for (NodeRef n : order) {
    if (!is_region_candidate(g, n)) continue;
    size_t target = regions.size();
    regions.push_back({n});
    region_of[n.p] = target;
    std::set<size_t> producers;
    for (size_t i = 0; i < g.num_inputs(n); ++i) {
      const NodeRef p = g.producer(g.input(n, i));
      if (!p || g.owner(p) != g.owner(n) || pos.span.count(p.p) == 0 ||
          pos.span.at(p.p) != pos.span.at(n.p))
        continue;
      auto it = region_of.find(p.p);
      if (it != region_of.end() && it->second != target) producers.insert(it->second);
    }
    for (size_t id : producers) {
      std::vector<NodeRef> merged = regions[id];
      merged.insert(merged.end(), regions[target].begin(), regions[target].end());
      sort_by_position(merged, pos);
      if (!insertion_point(g, merged, pos)) continue;
      for (NodeRef m : regions[target]) region_of[m.p] = id;
      regions[id] = std::move(merged);
      regions[target].clear();
      target = id;
    }
  }
  regions.erase(std::remove_if(regions.begin(), regions.end(),
                               [](const std::vector<NodeRef>& r) { return r.empty(); }),
                regions.end());
  // Top-level regions first, then by the position of the node owning their
  // block (both branches of an If together); in program order within. (The
  // TorchScript pass's order before the core went block by block, pre-order:
  // it differs for an If nested in another's branch, which only changes the
  // order in which regions of different blocks are priced.)
  std::stable_sort(regions.begin(), regions.end(),
                   [&](const std::vector<NodeRef>& a, const std::vector<NodeRef>& b) {
                     const NodeRef oa = g.owner(a.front()), ob = g.owner(b.front());
                     const size_t pa = oa ? pos.pos(oa) + 1 : 0, pb = ob ? pos.pos(ob) + 1 : 0;
                     return pa < pb;
                   });
  return regions;
}

RegionDecision decide_region(const GraphView& g, std::vector<NodeRef> nodes,
                             const CostPolicy& policy, const MayRequireGrad& grad,
                             const StorageFacts& storage) {
  RegionDecision out;
  Region& r = out.region;
  r.nodes = std::move(nodes);
  describe_values(g, r);
  price(g, r, policy, grad);
  Decision& dec = out.decision;
  dec.pass = kRecomputeRegionsPass;
  dec.site = where(g, r);
  dec.verdict = Decision::Verdict::Note;
  if (r.before == 0 && !r.unknown) return out; // keeps nothing today: nothing to say
  dec.verdict = Decision::Verdict::Kept;
  dec.price = r.unknown ? Price{} : Price{r.before, r.after, static_cast<double>(r.full_size_ops)};
  // The known activations in it, and what output-saving them alone would free.
  for (NodeRef n : r.nodes) {
    auto info = activation_info(c10::Symbol::fromQualString(g.kind(n)));
    if (!info || g.kind(n) != info->aten.toQualString()) continue;
    if (auto p = output_saving_price(g, n, policy)) r.alone += std::max<int64_t>(0, p->freed());
    r.acts += (r.acts.empty() ? "" : ", ") + g.kind(n);
  }
  std::ostringstream kept;
  NodeRef point;
  if (r.unknown) {
    kept << "unknown shape (give input shapes)";
  } else if (!r.acts.empty() && r.freed() <= r.alone) {
    kept << "left to the activation passes (output-saving " << r.acts << " alone frees " << r.alone
         << " B; recomputing the region would free " << r.freed() << " B)";
  } else if (r.freed() < policy.min_bytes) {
    kept << "frees " << r.freed() << " B, below the " << policy.min_bytes
         << " B minimum (its inputs cost " << r.after << " B)";
  } else if (r.full_size_ops == 0) {
    kept << "only 0-dim values (nothing worth recomputing)";
  } else if (policy.max_added_work >= 0 && r.full_size_ops > policy.max_added_work) {
    kept << "recomputes " << r.full_size_ops << " full-size ops in backward, above the maximum "
         << policy.max_added_work;
  } else if (!(point = insertion_point(g, r.nodes, positions(g)))) {
    kept << "an input is defined after a consumer of its outputs (no valid place)";
  } else {
    for (ValueRef in : r.inputs)
      if (const std::string why = poisoned_history(g, in, r, storage); !why.empty()) {
        kept << why;
        point = NodeRef{};
        break;
      }
  }
  if (!point) {
    dec.text = kept.str();
    return out;
  }
  out.point = point;
  std::ostringstream why;
  why << "rewrote " << dec.site << ": keeps its " << r.inputs.size() << " input"
      << (r.inputs.size() == 1 ? "" : "s") << " instead of " << r.kept_values
      << " intermediate values, frees " << r.freed() << " B (" << r.before << " -> " << r.after
      << "), recomputes " << r.full_size_ops << " full-size ops in backward"
      << (r.assumed ? " (assumed shapes)" : "");
  if (!r.acts.empty())
    why << "; more than output-saving " << r.acts << " alone (" << r.alone << " B)";
  dec.verdict = Decision::Verdict::Rewrote;
  dec.text = why.str();
  out.guarded = r.inputs;
  for (NodeRef n : r.nodes) out.guarded.push_back(g.output(n, 0));
  return out;
}

} // namespace memslim
