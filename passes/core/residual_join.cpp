//===- residual_join.cpp - the residual-join decision, any view -------------===//
//
// Finds, prices and decides one join site (see residual_join.h).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/residual_join.h"

#include <algorithm>
#include <sstream>

#include "memslim/core/activation_table.h"
#include "memslim/core/fuse_dropout.h"
#include "memslim/core/norm_table.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/output_saving_norms.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {

bool alpha_is_one(const GraphView& g, NodeRef add) {
  if (g.num_inputs(add) < 3) return true;
  const auto a = g.constant(g.input(add, 2));
  return a && ((a->isInt() && a->toInt() == 1) || (a->isDouble() && a->toDouble() == 1.0));
}

} // namespace

bool is_residual_join_site(const GraphView& g, NodeRef add) {
  const std::string k = g.kind(add);
  return (k == "aten::add" || k == "aten::add_") && g.num_inputs(add) >= 2 &&
         g.num_outputs(add) == 1 && g.is_tensor(g.input(add, 0)) && g.is_tensor(g.input(add, 1)) &&
         alpha_is_one(g, add);
}

std::string reads_running_stats_between(const GraphView& g, NodeRef norm, NodeRef add) {
  if (g.kind(norm) != "aten::batch_norm" || g.num_inputs(norm) < 5) return "";
  bool between = false;
  std::vector<NodeRef> inside;
  for (NodeRef n : g.nodes()) {
    if (n == norm) {
      between = true;
      continue;
    }
    if (n == add) break;
    if (between) inside.push_back(n);
  }
  for (int i : {3, 4}) {
    const ValueRef v = g.input(norm, i);
    if (!g.is_tensor(v)) continue;
    for (const Use& u : g.uses(v))
      if (std::find(inside.begin(), inside.end(), u.user) != inside.end()) return g.kind(u.user);
  }
  return "";
}

NodeRef join_norm(const GraphView& g, NodeRef add, int* which) {
  if (!is_residual_join_site(g, add)) return NodeRef{};
  const bool inplace = g.kind(add) == "aten::add_";
  for (int i = 0; i < (inplace ? 1 : 2); ++i) {
    const ValueRef y = g.input(add, i);
    const NodeRef n = g.producer(y);
    if (n && is_norm_site(g, n) && g.uses(y).size() == 1 && g.owner(n) == g.owner(add)) {
      if (which) *which = i;
      return n;
    }
  }
  return NodeRef{};
}

bool join_would_take(const GraphView& g, NodeRef add, ValueRef r) {
  int which = -1;
  return join_norm(g, add, &which) && g.input(add, 1 - which) == r;
}

JoinDecision decide_residual_join(const GraphView& g, NodeRef add, const CostPolicy& policy) {
  JoinDecision out;
  Decision& d = out.decision;
  d.pass = kFuseResidualJoinPass;
  d.site = site_name(g, add);
  d.verdict = Decision::Verdict::Note; // not a join: no record
  out.inplace = g.kind(add) == "aten::add_";
  int which = -1;
  if (!join_norm(g, add, &which)) return out;
  const ValueRef y = g.input(add, which);
  const ValueRef r = g.input(add, 1 - which);
  const ValueRef sum = g.output(add, 0);
  out.norm = g.producer(y);
  const NormInfo info = *norm_info(c10::Symbol::fromQualString(g.kind(out.norm)));
  out.join_kind = std::string(info.memslim.toQualString()) + "_add";
  d.verdict = Decision::Verdict::Kept;
  const ValueRef x = g.input(out.norm, 0);
  const auto xb = g.bytes(x), yb = g.bytes(y), rb = g.bytes(r), sb = g.bytes(sum);
  const auto xn = g.numel(x), yn = g.numel(y), rn = g.numel(r);
  const auto xt = g.dtype(x), yt = g.dtype(y), rt = g.dtype(r);
  if (!xb || !yb || !rb || !sb || !xt) {
    d.text = "unknown shape (give input shapes)";
    return out;
  }
  if (*yn != *rn || *yt != *rt) {
    d.text = "the residual's shape or dtype differs from the norm's output (a broadcast)";
    return out;
  }
  if (policy.max_added_work >= 0 && info.added_work + 1 > policy.max_added_work) {
    std::ostringstream why;
    why << "adds ~" << info.added_work + 1 << " passes per element, above the maximum "
        << policy.max_added_work;
    d.text = why.str();
    return out;
  }
  // The op stands where the add stood: a batch norm's running-stat update moves
  // there. Nothing between may read the running statistics (it would see them
  // before the update). (TorchScript reaches a buffer through more than one
  // GetAttr: its adapter also compares attribute paths.)
  if (const std::string who = reads_running_stats_between(g, out.norm, add); !who.empty()) {
    d.text = who + " reads the norm's running statistics between the norm and the add";
    return out;
  }
  // The residual: an activation read only here goes into the op.
  out.residual = r;
  out.spec = ActSpec{"none", "none", {}};
  const NodeRef rp = g.producer(r);
  std::optional<ActivationInfo> act_info;
  if (rp && !g.is_input(r) && g.uses(r).size() == 1 && g.owner(rp) == g.owner(add) &&
      g.num_outputs(rp) == 1 && g.num_inputs(rp) > 0 && g.is_tensor(g.input(rp, 0))) {
    act_info = activation_info(c10::Symbol::fromQualString(g.kind(rp)));
    if (act_info && g.kind(rp) == act_info->aten.toQualString()) {
      if (auto spec = activation_spec_of(g, rp)) {
        out.act = rp;
        out.spec = *spec;
        out.residual = g.input(rp, 0);
      }
    }
  }
  saved::NodeSet self{out.norm, add};
  if (out.act) self.insert(out.act);
  // What aten keeps: x (+ extra), and what the folded activation kept.
  int64_t aten = norm_input_keeps(g, out.norm, saved::kept_by_other(g, x, self), *xb, *xn, *xt);
  if (out.act) {
    const bool keeps_in = act_info->aten_keeps == Keeps::Input;
    const ValueRef kept = keeps_in ? out.residual : r;
    const auto kb = g.bytes(kept);
    if (!kb) {
      d.text = "unknown shape (give input shapes)";
      return out;
    }
    if (!saved::kept_by_other(g, kept, self)) aten += *kb;
  }
  std::string sum_by, res_by;
  const bool sum_else = saved::kept_by_other(g, sum, self, &sum_by);
  const bool res_else = saved::kept_by_other(g, out.residual, self, &res_by);
  const auto resb = g.bytes(out.residual);
  if (!resb) {
    d.text = "unknown shape (give input shapes)";
    return out;
  }
  const int64_t ours = (sum_else ? 0 : *sb) + (res_else ? 0 : *resb);
  // A norm made the residual and nothing else reads it: output-saving-norms
  // will keep it for that norm instead of its input (priced here).
  int64_t bonus = 0;
  std::string chain;
  const NodeRef rn_node = g.producer(out.residual);
  if (!out.act && !res_else && rn_node && is_norm_site(g, rn_node) &&
      g.uses(out.residual).size() == 1) {
    bonus = norm_output_saving_frees(g, rn_node);
    if (bonus > 0)
      chain = "; " + g.kind(rn_node) + " at " + g.name(out.residual) + " keeping its output then";
  }
  d.price = {aten, ours, info.added_work + 1};
  const int64_t freed = aten - ours + bonus;
  std::ostringstream why;
  if (freed < policy.min_bytes || freed <= 0) {
    why << "frees " << freed << " B (would keep " << g.name(sum)
        << (sum_else ? "" : ", kept by nobody today") << " and " << g.name(out.residual)
        << (res_else ? "" : ", kept by nobody today") << " instead of " << g.name(x) << ")";
    d.text = why.str();
    return out;
  }
  out.guarded = {x, y, r, sum};
  if (out.residual != r) out.guarded.push_back(out.residual);
  for (int a : {info.weight_arg, info.bias_arg})
    if (a >= 0 && size_t(a) < g.num_inputs(out.norm) && g.is_tensor(g.input(out.norm, a)))
      out.guarded.push_back(g.input(out.norm, a));
  why << "joined " << g.kind(out.norm) << " at " << g.name(y) << " and "
      << (out.act ? g.kind(out.act) + " at " + g.name(r) : g.name(r)) << " into " << out.join_kind
      << ": keeps " << g.name(sum) << " and " << g.name(out.residual) << " instead of " << g.name(x)
      << ", frees " << (aten - ours) << " B (" << aten << " -> " << ours << ")";
  if (!chain.empty()) why << chain << " frees " << bonus << " B more";
  d.verdict = Decision::Verdict::Rewrote;
  d.text = why.str();
  return out;
}

} // namespace memslim
