//===- gated_mlp.cpp - linear(act(g) * u) keeping g and u ------------------===//
//
// Finds, prices and decides one gated MLP's down projection (see gated_mlp.h).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/gated_mlp.h"

#include <sstream>

#include "memslim/core/activation_table.h"
#include "memslim/core/fuse_dropout.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {

bool only_reader(const GraphView& g, ValueRef v, NodeRef reader) {
  const auto uses = g.uses(v);
  return uses.size() == 1 && uses[0].user == reader;
}

// The activation node making input `i` of the mul, or null.
NodeRef activation_at(const GraphView& g, NodeRef mul, size_t i) {
  const NodeRef a = g.producer(g.input(mul, i));
  if (!a || g.is_input(g.input(mul, i))) return {};
  auto info = activation_info(c10::Symbol::fromQualString(g.kind(a)));
  if (!info || g.kind(a) != info->aten.toQualString() || g.num_outputs(a) != 1 ||
      !g.is_tensor(g.input(a, 0)))
    return {};
  return a;
}

} // namespace

bool is_gated_mlp_site(const GraphView& g, NodeRef n) {
  if (g.kind(n) != "aten::linear" || g.num_inputs(n) != 3 || g.num_outputs(n) != 1) return false;
  const NodeRef m = g.producer(g.input(n, 0));
  return m && !g.is_input(g.input(n, 0)) && g.kind(m) == "aten::mul" && g.num_inputs(m) == 2 &&
         g.is_tensor(g.input(m, 0)) && g.is_tensor(g.input(m, 1));
}

FormulaDecision decide_gated_mlp(const GraphView& g, NodeRef n, const CostPolicy& policy) {
  FormulaDecision out;
  Decision& d = out.decision;
  d.pass = kGatedMlpPass;
  d.site = site_name(g, n);
  d.verdict = Decision::Verdict::Kept;
  const NodeRef mul = g.producer(g.input(n, 0));
  size_t gi = 0;
  NodeRef a = activation_at(g, mul, 0);
  if (!a) a = activation_at(g, mul, gi = 1);
  if (!a) {
    d.text = "its input is a product without an activation of the table";
    return out;
  }
  const ValueRef prod = g.output(mul, 0), act_out = g.output(a, 0);
  const ValueRef gate = g.input(a, 0), up = g.input(mul, 1 - gi);
  if (up == act_out || g.owner(a) != g.owner(n) || g.owner(mul) != g.owner(n)) {
    d.text = "the product is not act(g) * u in one block";
    return out;
  }
  if (!only_reader(g, prod, n) || !only_reader(g, act_out, mul)) {
    d.text = "the product or the activation has other readers";
    return out;
  }
  const auto ps = g.sizes(prod), as = g.sizes(act_out), us = g.sizes(up);
  const auto pb = g.bytes(prod), ab = g.bytes(act_out), ub = g.bytes(up), gb = g.bytes(gate);
  if (!ps || !as || !us || !pb || !ab || !ub || !gb) {
    d.text = "unknown shape (give input shapes)";
    return out;
  }
  if (*as != *ps || *us != *ps || g.dtype(gate) != g.dtype(up)) {
    d.text = "act(g) and u do not have the product's shape and dtype (a broadcast)";
    return out;
  }
  auto spec = activation_spec_of(g, a);
  if (!spec) {
    d.text = "the activation's arguments are not constants";
    return out;
  }
  constexpr double kWork = 2.0; // act(g) and the product, once more in backward
  if (policy.max_added_work >= 0 && kWork > policy.max_added_work) {
    std::ostringstream why;
    why << "adds ~" << kWork << " evaluations per element in backward, above the maximum "
        << policy.max_added_work;
    d.text = why.str();
    d.price = {std::nullopt, std::nullopt, kWork};
    return out;
  }
  const ActivationInfo info = *activation_info(c10::Symbol::fromQualString(g.kind(a)));
  const saved::NodeSet self{a, mul, n};
  const bool g_else = saved::kept_by_other(g, gate, self);
  const bool u_else = saved::kept_by_other(g, up, self);
  // aten: the activation keeps g (or act(g)), the mul keeps act(g) and u, the
  // linear keeps the product.
  // u may be g itself (silu(g) * g): one tensor, counted once.
  const bool same = up == gate;
  const int64_t g_kept = (info.aten_keeps == Keeps::Input || same) && !g_else ? *gb : 0;
  const int64_t u_kept = !same && !u_else ? *ub : 0;
  const int64_t aten = g_kept + *ab + u_kept + *pb;
  const int64_t ours = (g_else ? 0 : *gb) + u_kept;
  d.price = {aten, ours, kWork};
  const int64_t freed = aten - ours;
  std::ostringstream why;
  if (freed < policy.min_bytes || freed <= 0) {
    why << "frees " << freed << " B, below the " << policy.min_bytes << " B minimum";
    d.text = why.str();
    return out;
  }
  why << "rewrote aten::linear at " << g.name(g.output(n, 0)) << " of " << g.kind(a) << "("
      << g.name(gate) << ") * " << g.name(up)
      << " (memslim::gated_linear): keeps the gate and up projections, recomputes the "
         "product in backward, frees "
      << freed << " B (" << aten << " -> " << ours << ")";
  d.text = why.str();
  d.verdict = Decision::Verdict::Rewrote;
  out.op = "memslim::gated_linear";
  out.args = {{gate, std::nullopt, ""},
              {up, std::nullopt, ""},
              {g.input(n, 1), std::nullopt, ""},
              {g.input(n, 2), std::nullopt, ""},
              {{}, c10::IValue(spec->act), "'" + spec->act + "'"},
              {{}, c10::IValue(spec->params), "params"}};
  out.covers = {a, mul, n};
  out.guarded = {gate, up, act_out, prod, g.input(n, 1)};
  return out;
}

} // namespace memslim
