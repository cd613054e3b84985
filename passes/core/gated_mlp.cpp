//===- gated_mlp.cpp - linear(act(g) * u) keeping g and u ------------------===//
//
// Finds, prices and decides one gated MLP's down projection (see gated_mlp.h),
// also the GLU form whose g and u are two views of one projection (chunk,
// split, slices of its last dim): one storage, counted once in the price.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/gated_mlp.h"

#include <algorithm>
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

// Where g and u are views of one tensor along one dim: the two outputs of an
// aten::chunk / split / split_with_sizes (through prim::ListUnpack in
// TorchScript; FX's getitems are the node's outputs), or two aten::slice of
// one base with step 1. `halves`: exactly the two halves of the base's last
// dim (the GLU form: gate_up_proj's output chunked), else some other pair of
// pieces (chunk into 3: the base stays kept whole either way).
struct Views {
  ValueRef base;
  std::string form; // "aten::chunk", "aten::split", "aten::slice"
  bool halves = false;
};

std::optional<Views> views_of_one(const GraphView& g, ValueRef gate, ValueRef up) {
  if (gate == up) return std::nullopt;
  const NodeRef pg = g.producer(gate), pu = g.producer(up);
  if (!pg || !pu || g.is_input(gate) || g.is_input(up)) return std::nullopt;
  const auto gs = g.sizes(gate);
  Views out;
  std::optional<int64_t> dim;
  if (pg == pu) {
    const bool unpacked = g.kind(pg) == "prim::ListUnpack";
    const NodeRef s = unpacked ? g.producer(g.input(pg, 0)) : pg;
    if (!s) return std::nullopt;
    const std::string k = g.kind(s);
    if (k != "aten::chunk" && k != "aten::split" && k != "aten::split_with_sizes" &&
        k != "aten::unsafe_chunk" && k != "aten::unsafe_split")
      return std::nullopt;
    if (g.num_inputs(s) != 3 || !g.is_tensor(g.input(s, 0))) return std::nullopt;
    out.base = g.input(s, 0);
    out.form = k;
    dim = g.dim_of(g.input(s, 2), out.base);
  } else {
    if (g.kind(pg) != "aten::slice" || g.kind(pu) != "aten::slice" || g.num_inputs(pg) != 5 ||
        g.num_inputs(pu) != 5 || g.input(pg, 0) != g.input(pu, 0))
      return std::nullopt;
    out.base = g.input(pg, 0);
    out.form = "aten::slice";
    dim = g.dim_of(g.input(pg, 1), out.base);
    if (!dim || dim != g.dim_of(g.input(pu, 1), out.base)) return std::nullopt;
    for (NodeRef n : {pg, pu})
      if (g.int_constant(g.input(n, 4)) != 1) return std::nullopt;
    // The halves: one slice starts at 0 (or None), the other where it ends.
    auto start = [&](NodeRef n) -> std::optional<int64_t> {
      const auto c = g.constant(g.input(n, 2));
      if (c && c->isNone()) return 0;
      return g.int_constant(g.input(n, 2));
    };
    const auto bs = g.sizes(out.base);
    const auto a = start(pg), b = start(pu);
    if (!a || !b || !gs || !bs || *dim != static_cast<int64_t>(bs->size()) - 1) return out;
    const int64_t n = gs->back();
    out.halves = 2 * n == bs->back() && std::min(*a, *b) == 0 && std::max(*a, *b) == n;
    return out;
  }
  const auto bs = g.sizes(out.base);
  out.halves = dim && gs && bs && *dim == static_cast<int64_t>(bs->size()) - 1 &&
               2 * gs->back() == bs->back();
  return out;
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
  // The form, said by every record from here on: g and u as views of one
  // projection (the GLU form) or two values.
  const auto views = views_of_one(g, gate, up);
  const std::string form =
      views ? std::string(views->halves ? "the two halves of " : "two views of ") +
                  g.name(views->base) + " (" + views->form + ")"
            : std::string();
  auto kept = [&](std::string why) {
    d.text = form.empty() ? why : why + "; g and u: " + form;
    return out;
  };
  if (up == act_out || g.owner(a) != g.owner(n) || g.owner(mul) != g.owner(n)) {
    return kept("the product is not act(g) * u in one block");
  }
  if (!only_reader(g, prod, n) || !only_reader(g, act_out, mul)) {
    return kept("the product or the activation has other readers");
  }
  const auto ps = g.sizes(prod), as = g.sizes(act_out), us = g.sizes(up);
  const auto pb = g.bytes(prod), ab = g.bytes(act_out), ub = g.bytes(up), gb = g.bytes(gate);
  if (!ps || !as || !us || !pb || !ab || !ub || !gb) {
    return kept("unknown shape (give input shapes)");
  }
  if (*as != *ps || *us != *ps || g.dtype(gate) != g.dtype(up)) {
    return kept("act(g) and u do not have the product's shape and dtype (a broadcast)");
  }
  auto spec = activation_spec_of(g, a);
  if (!spec) {
    return kept("the activation's arguments are not constants");
  }
  constexpr double kWork = 2.0; // act(g) and the product, once more in backward
  if (policy.max_added_work >= 0 && kWork > policy.max_added_work) {
    std::ostringstream why;
    why << "adds ~" << kWork << " evaluations per element in backward, above the maximum "
        << policy.max_added_work;
    d.price = {std::nullopt, std::nullopt, kWork};
    return kept(why.str());
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
  int64_t aten = g_kept + *ab + u_kept + *pb;
  int64_t ours = (g_else ? 0 : *gb) + u_kept;
  // g and u views of one tensor (gate_up_proj chunked): one storage, kept by
  // aten's mul (u) either way and by the op through both views: counted once,
  // on both sides, unless another node keeps it (or a view of it) anyway.
  const auto base_b = views ? g.bytes(views->base) : std::nullopt;
  if (views && base_b) {
    const bool base_else = g_else || u_else || saved::kept_by_other(g, views->base, self);
    const int64_t base_kept = base_else ? 0 : *base_b;
    aten = base_kept + *ab + *pb;
    ours = base_kept;
  }
  d.price = {aten, ours, kWork};
  const int64_t freed = aten - ours;
  std::ostringstream why;
  if (freed < policy.min_bytes || freed <= 0) {
    why << "frees " << freed << " B, below the " << policy.min_bytes << " B minimum";
    return kept(why.str());
  }
  why << "rewrote aten::linear at " << g.name(g.output(n, 0)) << " of " << g.kind(a) << "("
      << g.name(gate) << ") * " << g.name(up);
  if (views) why << ", " << form;
  why << " (memslim::gated_linear): keeps the gate and up projections, recomputes the "
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
