//===- recompute_regions.h - elementwise regions kept as their inputs, any view //
//
// What: the recompute-pointwise-regions decision over a GraphView: maximal
// regions of functional elementwise ops (a hand-written activation's formula,
// a trainable 0-dim order and scalar constants as operands), priced as the
// bytes their nodes make autograd keep against the bytes of their inputs,
// against output-saving a known activation inside alone, and placed where one
// op can replace them. memslim::recompute_region keeps only the inputs and
// re-runs the region in backward.
// Why here: the TorchScript pass (passes/recompute_pointwise_regions.cpp) and
// the FX front end (fx/fx_front_end.cpp) decide with these functions; each
// applies a decision its own way (TorchScript: the op with the region's cloned
// graph; FX: the op with the text region_ir() builds, or, under
// torch.compile, recompute tags for Inductor's partitioner).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kRecomputeRegionsPass = "recompute-pointwise-regions";
inline constexpr const char* kRecomputeRegionOp = "memslim::recompute_region";

// Which values may require grad in training: what the view knows
// (GraphView::requires_grad), else floating tensors that are graph inputs, or
// computed by an op from a value that may (anything from a prim / python node
// conservatively may). Refines what a region's nodes keep: autograd records
// nothing for an op none of whose inputs requires grad, and mul keeps an
// operand only for the other's gradient (FracAct's `acc * pow(-1, n)` with a
// buffer n keeps nothing). Computed once; a rewrite makes it stale.
class MayRequireGrad {
 public:
  explicit MayRequireGrad(const GraphView& g);
  bool operator()(ValueRef v) const;

 private:
  bool floating(ValueRef v) const;
  const GraphView& g_;
  std::unordered_map<const void*, bool> grad_;
};

// How a front end follows storage through aliases and writes (the TorchScript
// analysis also knows chunk pieces and If outputs; the FX gate what schemas
// declare): the poisoned-history check reads these.
struct StorageFacts {
  std::function<ValueRef(ValueRef)> root;
  std::function<std::vector<ValueRef>(NodeRef)> written;
};

// Whether `n` may join a region: one tensor output, a functional elementwise
// op of the table, every operand a tensor or a scalar constant.
bool is_region_candidate(const GraphView& g, NodeRef n);
// Whether `v` is a scalar constant a region copies into its own graph.
bool is_region_constant(const GraphView& g, ValueRef v);

// Regions of each block, grown greedily in program order: a candidate joins
// the region of each candidate producing one of its inputs when the merged
// region still has a valid place and both run in the same grad mode (no
// `with no_grad` / autocast switch between them). Each region's nodes are in
// program order.
std::vector<std::vector<NodeRef>> form_regions(const GraphView& g);

struct Region {
  std::vector<NodeRef> nodes;    // program order
  std::vector<ValueRef> inputs;  // external tensor inputs, in order of first use
  std::vector<ValueRef> outputs; // values used outside the region
  int64_t before = 0, after = 0; // bytes its nodes keep today / its inputs would keep
  int64_t kept_values = 0;       // how many values `before` counts
  int64_t full_size_ops = 0;     // ops with more than one element (recomputed in backward)
  int64_t alone = 0;             // what output-saving its known activations frees
  std::string acts;              // those activations
  bool assumed = false;
  bool unknown = false;
  int64_t freed() const { return before - after; }
};

// The decision on the region of `nodes` (one of form_regions', on the graph as
// earlier rewrites left it). A Rewrote decision still goes through the front
// end's safety gate with `guarded` (the op keeps the inputs; the original
// nodes kept their intermediates); the op goes just before `point`.
struct RegionDecision {
  Decision decision;
  Region region;
  NodeRef point;
  std::vector<ValueRef> guarded;
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
RegionDecision decide_region(const GraphView& g, std::vector<NodeRef> nodes,
                             const CostPolicy& policy, const MayRequireGrad& grad,
                             const StorageFacts& storage);

} // namespace memslim
