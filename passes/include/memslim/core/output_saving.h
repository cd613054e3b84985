//===- output_saving.h - the output-saving activation decision, any view ---===//
//
// What: whether an aten activation (gelu, silu, mish, hardswish, softplus,
// elu, celu, selu, leaky_relu, hardsigmoid, relu) should become its memslim op
// (same arguments), priced from the saved-tensor rules over a GraphView: aten
// keeps the activation's input, the memslim op its output (shared with the
// consumer that keeps it anyway) plus n/8 bytes, or only a bit mask.
// Why here: the TorchScript pass (passes/output_saving_activations.cpp) and
// the FX front end (core/fx_driver.cpp) both decide with this function; each
// only finds sites, submits the rewrite to its safety gate and applies it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kOutputSavingPass = "output-saving-activations";

// Bytes aten's op makes autograd keep beyond what others keep anyway, and the
// memslim op's. nullopt: not an activation, or unknown shape without
// policy.assume_numel.
struct OutputSavingPrice {
  int64_t aten = 0, ours = 0;
  std::string x_kept_by, y_kept_by; // who else keeps input / output ("" nobody)
  bool assumed = false;             // priced with policy.assume_numel
  int64_t freed() const { return aten - ours; }
};
std::optional<OutputSavingPrice> output_saving_price(const GraphView& g, NodeRef n,
                                                     const CostPolicy& policy);

// Whether `n` is an aten activation the rewrite knows (a site).
bool is_output_saving_site(const GraphView& g, NodeRef n);

// The decision at site `n`: Rewrote (the pass's sentence and price) or Kept
// (the reason). A Rewrote decision still goes through the front end's safety
// gate, which guards `guarded`: the memslim op keeps y, and aten kept x (a
// later in-place write to x makes aten's backward fail, which the rewrite must
// not silence).
struct OutputSavingDecision {
  Decision decision;
  std::string memslim_kind; // "memslim::gelu"
  ValueRef guarded[2];      // x, y
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
OutputSavingDecision decide_output_saving(const GraphView& g, NodeRef n, const CostPolicy& policy);

// "aten::gelu at %h": how a decision names its site.
std::string site_name(const GraphView& g, NodeRef n);

} // namespace memslim
