//===- output_saving.cpp - the output-saving activation decision, any view -===//
//
// Prices and decides one activation site (see output_saving.h). The site's
// input x and output y are priced by who else keeps them: x kept by another
// consumer frees nothing, y kept by nobody costs its bytes.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/output_saving.h"

#include <sstream>

#include "memslim/core/activation_table.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {

// Bytes this activation makes autograd keep, beyond what others keep anyway.
int64_t kept_bytes(Keeps k, bool x_kept_elsewhere, bool y_kept_elsewhere, int64_t x_bytes,
                   int64_t y_bytes, int64_t bits) {
  switch (k) {
    case Keeps::Input:
      return x_kept_elsewhere ? 0 : x_bytes;
    case Keeps::Output:
      return y_kept_elsewhere ? 0 : y_bytes;
    case Keeps::OutputAndBits:
      return (y_kept_elsewhere ? 0 : y_bytes) + bits;
    case Keeps::Bits:
      return bits;
  }
  return 0;
}

std::optional<ActivationInfo> info_of(const GraphView& g, NodeRef n) {
  return activation_info(c10::Symbol::fromQualString(g.kind(n)));
}

} // namespace

std::string site_name(const GraphView& g, NodeRef n) {
  return g.kind(n) + " at " + (g.num_outputs(n) ? g.name(g.output(n, 0)) : std::string("?"));
}

bool is_output_saving_site(const GraphView& g, NodeRef n) {
  auto info = info_of(g, n);
  return info && g.kind(n) == info->aten.toQualString() && g.num_inputs(n) > 0 &&
         g.num_outputs(n) == 1;
}

std::optional<OutputSavingPrice> output_saving_price(const GraphView& g, NodeRef n,
                                                     const CostPolicy& policy) {
  auto info = info_of(g, n);
  if (!info || g.num_inputs(n) == 0 || g.num_outputs(n) == 0) return std::nullopt;
  const ValueRef x = g.input(n, 0);
  const ValueRef y = g.output(n, 0);
  OutputSavingPrice p;
  auto xb = g.bytes(x), yb = g.bytes(y);
  auto n_el = g.numel(y);
  if (!xb || !yb || !n_el) {
    if (policy.assume_numel <= 0) return std::nullopt;
    n_el = policy.assume_numel;
    xb = yb = 4 * policy.assume_numel;
    p.assumed = true;
  }
  const saved::NodeSet self{n};
  const bool x_else = saved::kept_by_other(g, x, self, &p.x_kept_by);
  const bool y_else = saved::kept_by_other(g, y, self, &p.y_kept_by);
  const int64_t bits = (*n_el + 7) / 8;
  p.aten = kept_bytes(info->aten_keeps, x_else, y_else, *xb, *yb, bits);
  p.ours = kept_bytes(info->memslim_keeps, x_else, y_else, *xb, *yb, bits);
  return p;
}

OutputSavingDecision decide_output_saving(const GraphView& g, NodeRef n, const CostPolicy& policy) {
  const ActivationInfo info = *info_of(g, n);
  OutputSavingDecision out;
  out.memslim_kind = info.memslim.toQualString();
  out.guarded[0] = g.input(n, 0);
  out.guarded[1] = g.output(n, 0);
  Decision& d = out.decision;
  d.pass = kOutputSavingPass;
  d.site = site_name(g, n);
  d.verdict = Decision::Verdict::Kept;
  if (info.aten_keeps == Keeps::Output && info.memslim_keeps == Keeps::Output) {
    d.text = "aten already keeps only the output";
    return out;
  }
  std::ostringstream why;
  if (policy.max_added_work >= 0 && info.added_work > policy.max_added_work) {
    why << "adds ~" << info.added_work << " evaluations per element, above the maximum "
        << policy.max_added_work;
    d.text = why.str();
    d.price = {std::nullopt, std::nullopt, info.added_work};
    return out;
  }
  auto price = output_saving_price(g, n, policy);
  if (!price) {
    d.text = "unknown shape (give input shapes)";
    return out;
  }
  const OutputSavingPrice& p = *price;
  d.price = {p.aten, p.ours, info.added_work};
  if (p.freed() < policy.min_bytes) {
    if (info.aten_keeps == Keeps::Input && !p.x_kept_by.empty())
      why << "input also saved by " << p.x_kept_by;
    else if (p.y_kept_by.empty() && info.memslim_keeps != Keeps::Bits)
      why << "output not saved by any consumer (memslim would add " << (p.ours - p.aten) << " B)";
    else
      why << "frees " << p.freed() << " B, below the " << policy.min_bytes << " B minimum";
    d.text = why.str();
    return out;
  }
  why << "rewrote " << info.aten.toQualString() << " at " << g.name(out.guarded[1]) << ": keeps "
      << keeps_name(info.memslim_keeps) << " instead of " << keeps_name(info.aten_keeps)
      << ", frees " << p.freed() << " B (" << p.aten << " -> " << p.ours << ")"
      << (p.assumed ? " with assumed shapes" : "");
  d.verdict = Decision::Verdict::Rewrote;
  d.text = why.str();
  return out;
}

} // namespace memslim
