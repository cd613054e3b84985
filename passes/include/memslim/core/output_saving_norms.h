//===- output_saving_norms.h - the output-saving norm decision, any view ---===//
//
// What: whether an aten norm (layer_norm, rms_norm, group_norm, batch_norm)
// should become its memslim op (same arguments): aten keeps the norm's input
// (rms_norm also its normalized copy), the memslim op its output, which the
// next matmul / conv keeps anyway, plus per-group rstd. Priced from the
// saved-tensor rules: an input kept by another consumer frees nothing, an
// output kept by nobody costs its bytes.
// Why here: both front ends decide with this function (both through
// run_swap_pass, from the pass table's row).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kOutputSavingNormsPass = "output-saving-norms";

// Bytes aten's norm `n` keeps for backward beyond its output: its input x
// (x_bytes, unless another node keeps it) and, for rms_norm, its normalized
// copy in opmath. What the memslim op frees once a consumer keeps the output.
int64_t norm_input_keeps(const GraphView& g, NodeRef n, bool x_kept_elsewhere, int64_t x_bytes,
                         int64_t numel, c10::ScalarType dtype);

// Whether `n` is an aten norm the rewrite knows.
// Bytes the norm at `n` frees by keeping its output instead (its input's and
// aten's extra, where nothing else keeps the input), 0 where nothing or an
// unknown shape: the chain price of the rewrites that make a norm's output kept.
int64_t norm_output_saving_frees(const GraphView& g, NodeRef n);

bool is_norm_site(const GraphView& g, NodeRef n);

// The decision at a norm site. A Rewrote decision still goes through the
// front end's safety gate, which guards `guarded`: x (aten kept it), y (the
// memslim op keeps it), gamma and beta (the backward divides by them).
struct NormDecision {
  Decision decision;
  std::string memslim_kind; // "memslim::layer_norm"
  std::vector<ValueRef> guarded;
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
NormDecision decide_output_saving_norm(const GraphView& g, NodeRef n, const CostPolicy& policy);

} // namespace memslim
