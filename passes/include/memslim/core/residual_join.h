//===- residual_join.h - act(r) + norm(x) keeps the sum and r, any view ----===//
//
// What: whether a residual join `norm(x) + r` (aten::add, or ResNet's in-place
// `out += identity` on the norm's output) should become
// memslim::<norm>_add(residual, act, params, <the norm's arguments>), which
// keeps the sum and the residual instead of the norm's input, and rebuilds the
// norm's output as sum - act(residual) in backward. Where r is an activation's
// output read by nothing else (ResNet's identity = relu(previous sum)), the
// activation goes into the op: it keeps the activation's input (which the next
// block's fused conv keeps anyway) and recomputes act. Priced from the
// saved-tensor rules: aten keeps x (and what the folded activation kept); the
// op keeps the sum and the residual, each free where a neighbour keeps it
// anyway. Where r is another norm's output nothing else reads (a downsample
// branch), the price includes that norm then keeping its output instead of
// its input (output-saving-norms decides it).
// Why here: both front ends decide with this function.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"
#include "memslim/kernels/act_spec.h"

namespace memslim {

inline constexpr const char* kFuseResidualJoinPass = "fuse-residual-join";

// aten::add / add_ of two tensors with alpha 1 (a candidate; the decision
// says whether one operand is a norm it can take).
bool is_residual_join_site(const GraphView& g, NodeRef add);

// The norm whose output `add` reads and nothing else does (add_: as its self),
// `which` its operand; null: not a join.
NodeRef join_norm(const GraphView& g, NodeRef add, int* which = nullptr);

// A node between a batch norm and the add (graph order) that reads one of the
// norm's running statistics (its kind), or "".
std::string reads_running_stats_between(const GraphView& g, NodeRef norm, NodeRef add);

// Whether fuse-residual-join could take the activation whose output `r` is
// into the join at `add` (the other operand a norm's output read only there):
// fuse-activation-consumer prices the activation it leaves there as gone.
bool join_would_take(const GraphView& g, NodeRef add, ValueRef r);

struct JoinDecision {
  Decision decision;
  NodeRef norm;                  // the norm (goes with the rewrite)
  NodeRef act;                   // the folded activation (goes too), or null
  ValueRef residual;             // the op's first argument
  ActSpec spec;                  // act "none" without a folded activation
  std::string join_kind;         // "memslim::batch_norm_add"
  bool inplace = false;          // the add writes the norm's output (add_)
  std::vector<ValueRef> guarded; // x, the norm's output, r, residual, the sum, gamma, beta
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
JoinDecision decide_residual_join(const GraphView& g, NodeRef add, const CostPolicy& policy);

} // namespace memslim
