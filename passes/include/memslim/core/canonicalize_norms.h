//===- canonicalize_norms.h - hand-written RMSNorm / LayerNorm -> aten ------===//
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
// And LayerNorm over the last dim written out by hand, as BERT's original
// BertLayerNorm (TF style), xLSTM and many research codebases write it:
//   w * ((x - u) / sqrt(s + eps)) + b,   u = mean(x, -1, keepdim)
// with s = mean((x - u)^2, -1, keepdim) or var(x, -1, unbiased=False,
// keepdim), (x - u) * rsqrt(s + eps) also, w and b optional, any operand
// order; it becomes aten::layer_norm(x - u, [D], w, b, eps): the formula's own
// centring stays, and layer_norm normalises the centred rows. eps may be a
// value (a scripted module's `self.eps`, read where the formula read it).
// Why centre first: aten's one-pass moments on x itself leave x_hat ~1e-5
// where the formula's x - u is exactly 0 (a constant row: fuzz seed 600035
// gave gamma a 2.5e-5 gradient where eager's is 0); on centred rows the one
// pass and the formula's two agree to rounding, and zeros stay zeros. Saved
// bytes are layer_norm's (x - u instead of x, the same size; nothing once
// output-saving-norms takes the norm). Float32 only, a weight / bias of one
// dimension.
// The unbiased variance (x.var()'s default) is no layer norm: not matched.
// Why here: both front ends decide with these functions.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kCanonicalizeNormsPass = "canonicalize-norms";

struct NormMatch {
  Decision decision;           // Rewrote ("... -> aten::rms_norm") or Kept (why)
  std::string op;              // "aten::rms_norm" or "aten::layer_norm"
  NodeRef root;                // the formula's last node: its output becomes op(...)
  ValueRef x, weight, bias;    // the op's input (layer_norm: the formula's x - u), weight and
                               // bias (layer_norm: either null: None)
  int64_t dim = 0;             // D
  double eps = 0;              // the constant added to the mean / variance
  ValueRef eps_value;          // or the value added (a scripted module's float attribute)
  std::vector<NodeRef> covers; // the formula's nodes, in graph order
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};

// The match rooted at mul node `root`, or nullopt when it is no RMSNorm formula.
std::optional<NormMatch> match_rms_norm(const GraphView& g, NodeRef root);

// The match rooted at `root` (the bias add, the weight mul, or the normalising
// mul / div), or nullopt when it is no LayerNorm formula. Try roots last
// first: the add's match includes the mul's.
std::optional<NormMatch> match_layer_norm(const GraphView& g, NodeRef root);

} // namespace memslim
