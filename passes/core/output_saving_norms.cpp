//===- output_saving_norms.cpp - the output-saving norm decision, any view -===//
//
// Prices and decides one norm site (see output_saving_norms.h) from the
// norm table's columns and the saved-tensor rules.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/output_saving_norms.h"

#include <sstream>

#include "memslim/core/norm_table.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {
std::optional<NormInfo> info_of(const GraphView& g, NodeRef n) {
  return norm_info(c10::Symbol::fromQualString(g.kind(n)));
}
} // namespace

int64_t norm_input_keeps(const GraphView& g, NodeRef n, bool x_kept_elsewhere, int64_t x_bytes,
                         int64_t numel, c10::ScalarType dtype) {
  const int64_t opmath =
      (dtype == c10::kHalf || dtype == c10::kBFloat16) ? 4 : int64_t(c10::elementSize(dtype));
  return (x_kept_elsewhere ? 0 : x_bytes) + info_of(g, n)->aten_extra * numel * opmath;
}

int64_t norm_output_saving_frees(const GraphView& g, NodeRef n) {
  const ValueRef x = g.input(n, 0);
  const auto xb = g.bytes(x);
  const auto xt = g.dtype(x);
  const auto xn = g.numel(x);
  if (!xb || !xt || !xn || saved::kept_by_other(g, x, {n})) return 0;
  return norm_input_keeps(g, n, false, *xb, *xn, *xt);
}

bool is_norm_site(const GraphView& g, NodeRef n) {
  auto info = info_of(g, n);
  return info && g.kind(n) == info->aten.toQualString() && g.num_inputs(n) > 0 &&
         g.num_outputs(n) == 1 && g.is_tensor(g.input(n, 0));
}

NormDecision decide_output_saving_norm(const GraphView& g, NodeRef n, const CostPolicy& policy) {
  const NormInfo info = *info_of(g, n);
  NormDecision out;
  out.memslim_kind = info.memslim.toQualString();
  const ValueRef x = g.input(n, 0);
  const ValueRef y = g.output(n, 0);
  out.guarded = {x, y};
  for (int a : {info.weight_arg, info.bias_arg})
    if (a >= 0 && size_t(a) < g.num_inputs(n) && g.is_tensor(g.input(n, a)))
      out.guarded.push_back(g.input(n, a));
  Decision& d = out.decision;
  d.pass = kOutputSavingNormsPass;
  d.site = site_name(g, n);
  d.verdict = Decision::Verdict::Kept;
  std::ostringstream why;
  if (policy.max_added_work >= 0 && info.added_work > policy.max_added_work) {
    why << "adds ~" << info.added_work << " passes per element, above the maximum "
        << policy.max_added_work;
    d.text = why.str();
    d.price = {std::nullopt, std::nullopt, info.added_work};
    return out;
  }
  auto xb = g.bytes(x), yb = g.bytes(y);
  auto n_el = g.numel(y);
  auto dt = g.dtype(x);
  bool assumed = false;
  if (!xb || !yb || !n_el || !dt) {
    if (policy.assume_numel <= 0) {
      d.text = "unknown shape (give input shapes)";
      return out;
    }
    n_el = policy.assume_numel;
    xb = yb = 4 * policy.assume_numel;
    dt = c10::kFloat;
    assumed = true;
  }
  const saved::NodeSet self{n};
  std::string x_by, y_by;
  const bool x_else = saved::kept_by_other(g, x, self, &x_by);
  // The output costs nothing only where a reader surely keeps its bytes anyway.
  const bool y_else = saved::kept_by_other(g, y, self, &y_by, /*surely=*/true);
  const int64_t aten = norm_input_keeps(g, n, x_else, *xb, *n_el, *dt);
  const int64_t ours = y_else ? 0 : *yb;
  d.price = {aten, ours, info.added_work};
  const int64_t freed = aten - ours;
  if (!y_else) {
    // Only where a consumer keeps the output anyway. rms_norm would still free its
    // normalized copy, but a norm whose output nobody keeps is typically a model's
    // last (its output is the result): there the standard backward formula's
    // 1 - mean(y^2) cancels where aten's composite CPU rms_norm does not (a loss of
    // mean(y^2), measured on llama_small: 2.9e-3 per tensor, all of it that norm).
    why << "output not saved by any consumer (memslim would keep it instead of the input)";
    d.text = why.str();
    return out;
  }
  if (freed < policy.min_bytes || freed <= 0) {
    if (!y_else && info.aten_extra == 0)
      why << "output not saved by any consumer (memslim would keep it instead of the input: "
          << "no bytes freed)";
    else if (x_else)
      why << "input also saved by " << x_by;
    else
      why << "frees " << freed << " B, below the " << policy.min_bytes << " B minimum";
    d.text = why.str();
    return out;
  }
  why << "rewrote " << info.aten.toQualString() << " at " << g.name(y)
      << ": keeps output + rstd instead of input" << (info.aten_extra ? " + normalized copy" : "")
      << ", frees " << freed << " B (" << aten << " -> " << ours << ")"
      << (assumed ? " with assumed shapes" : "");
  d.verdict = Decision::Verdict::Rewrote;
  d.text = why.str();
  return out;
}

} // namespace memslim
