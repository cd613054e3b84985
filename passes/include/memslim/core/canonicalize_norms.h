//===- canonicalize_norms.h - hand-written RMSNorm -> aten::rms_norm -------===//
//
// What: recognises RMSNorm written out by hand, as transformers' LlamaRMSNorm
// (and T5LayerNorm, Mistral, Qwen...) write it:
//   weight * (h * rsqrt(mean(h^2, -1, keepdim) + eps)).to(dtype),  h = x.to(float32)
// in any operand order, with pow(h, 2) or h * h, and replaces it by
// aten::rms_norm(x, [D], weight, eps), which output-saving-norms can then
// rewrite. Only where x is float32 (every cast a no-op): aten's rms_norm
// computes exactly this formula then (bit for bit: same ops, same order of
// the products), while in 16-bit the hand-written form rounds twice.
// D is the reduced dim's size (numel(x) / numel(mean)); a weight of another
// shape makes aten's rms_norm raise (it checks weight.shape == [D]), never a
// silently different result.
// Why here: both front ends decide with this function.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kCanonicalizeNormsPass = "canonicalize-norms";

struct RmsNormMatch {
  Decision decision;           // Rewrote ("... -> aten::rms_norm") or Kept (why)
  NodeRef root;                // the final mul: its output becomes rms_norm(...)
  ValueRef x, weight;          // rms_norm's input and weight
  int64_t dim = 0;             // D
  double eps = 0;              // the constant added to the mean
  std::vector<NodeRef> covers; // the formula's nodes, root last
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};

// The match rooted at mul node `root`, or nullopt when it is no RMSNorm formula.
std::optional<RmsNormMatch> match_rms_norm(const GraphView& g, NodeRef root);

} // namespace memslim
