//===- max_pool.cpp - the max-pool positions decision, any view -------------===//
//
// Prices and decides one aten::max_pool2d site (see max_pool.h).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/max_pool.h"

#include <optional>
#include <sstream>

#include "memslim/core/canonicalize.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

bool is_max_pool_site(const GraphView& g, NodeRef n) {
  return g.kind(n) == "aten::max_pool2d" && g.num_inputs(n) == 6 && g.num_outputs(n) == 1 &&
         g.is_tensor(g.input(n, 0));
}

MaxPoolDecision decide_max_pool(const GraphView& g, NodeRef n, const CostPolicy& policy) {
  MaxPoolDecision out;
  Decision& d = out.decision;
  d.pass = kMaxPoolPass;
  d.site = site_name(g, n);
  d.verdict = Decision::Verdict::Kept;
  const ValueRef x = g.input(n, 0), y = g.output(n, 0);
  const auto xb = g.bytes(x);
  const auto yn = g.numel(y);
  if (!xb || !yn) {
    d.text = "unknown shape (give input shapes)";
    return out;
  }
  const auto k = int_list_constant(g, g.input(n, 1));
  if (!k || k->empty() || k->size() > 2) {
    d.text = "kernel_size is not a constant";
    return out;
  }
  int64_t window = 1;
  const auto& kv = *k;
  for (size_t i = 0; i < 2; ++i) window *= kv[kv.size() == 1 ? 0 : i];
  std::string x_by;
  const bool x_else = saved::kept_by_other(g, x, {n}, &x_by);
  const int64_t aten = (x_else ? 0 : *xb) + 8 * *yn;
  const int64_t ours = (window <= 127 ? 1 : 2) * *yn;
  d.price = {aten, ours, 0.5};
  std::ostringstream why;
  const int64_t freed = aten - ours;
  if (freed < policy.min_bytes || freed <= 0) {
    why << "frees " << freed << " B, below the " << policy.min_bytes << " B minimum";
    d.text = why.str();
    return out;
  }
  why << "rewrote aten::max_pool2d at " << g.name(y) << ": keeps "
      << (window <= 127 ? "int8" : "int16") << " window positions instead of "
      << (x_else ? "" : "its input and ") << "int64 indices, frees " << freed << " B (" << aten
      << " -> " << ours << ")";
  out.guarded = {x, y};
  d.verdict = Decision::Verdict::Rewrote;
  d.text = why.str();
  return out;
}

} // namespace memslim
