//===- functionalize.cpp - the in-place activation decision, any view ------===//
#include "memslim/core/functionalize.h"

#include "memslim/core/activation_table.h"
#include "memslim/core/output_saving.h"

namespace memslim {

std::optional<std::string> functional_of(const std::string& kind) {
  if (kind.rfind("aten::", 0) != 0 || kind.size() < 8 || kind.back() != '_') return std::nullopt;
  const std::string f = kind.substr(0, kind.size() - 1);
  auto info = activation_info(c10::Symbol::fromQualString(f));
  if (!info || f != info->aten.toQualString()) return std::nullopt;
  return f;
}

std::optional<FunctionalizeDecision> decide_functionalize(const GraphView& g, NodeRef n) {
  const auto f = functional_of(g.kind(n));
  if (!f || g.num_outputs(n) != 1 || g.num_inputs(n) == 0) return std::nullopt;
  const ActivationInfo info = *activation_info(c10::Symbol::fromQualString(*f));
  FunctionalizeDecision out;
  out.functional = *f;
  out.written = g.input(n, 0);
  out.guarded = g.output(n, 0);
  Decision& d = out.decision;
  d.pass = kFunctionalizePass;
  d.site = site_name(g, n);
  if (info.inplace_keeps != info.aten_keeps) {
    d.verdict = Decision::Verdict::Kept;
    d.text = std::string("the in-place form keeps its ") + keeps_name(info.inplace_keeps) + ", " +
             *f + " would keep its " + keeps_name(info.aten_keeps);
    return out;
  }
  d.verdict = Decision::Verdict::Rewrote;
  d.text = d.site + " -> " + *f + " (its input has no other use)";
  return out;
}

} // namespace memslim
