//===- fuse_act_consumer.h - linear/conv(act(h)) keeps h, any view ---------===//
//
// What: whether an aten activation whose output only linear / conv layers read
// (as their input) should be folded into them: each consumer becomes
// memslim::act_<consumer>(h, <its other arguments>, act, params) (rows of
// consumer_table.def), which keeps h and recomputes act(h) in backward; the
// activation node goes. Priced from the saved-tensor rules: aten keeps act(h)
// in the consumers plus h or act(h) in the activation; the fused ops keep h,
// often kept anyway. When h is a norm's output that nothing else reads, the
// price includes the norm then keeping its output instead of its input
// (output-saving-norms, which runs next, decides and rewrites it): conv ->
// norm -> act -> conv keeps one tensor, for ReLU too.
// Why here: both front ends decide with this function.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"
#include "memslim/kernels/act_spec.h"

namespace memslim {

inline constexpr const char* kFuseActConsumerPass = "fuse-activation-consumer";

// Whether `a` is an aten activation of activation_table.def with a tensor input.
bool is_act_consumer_site(const GraphView& g, NodeRef a);

struct ActConsumerDecision {
  Decision decision;
  ActSpec spec;                        // the kernel activation the fused ops take
  ValueRef h;                          // the activation's input
  std::vector<NodeRef> passed;         // identity dropouts between (they go too)
  std::vector<NodeRef> consumers;      // each becomes fused_kind[i]
  std::vector<std::string> fused_kind; // "memslim::act_conv2d"
  std::vector<ValueRef> guarded;       // h, the activation's output, the consumers' weights
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
ActConsumerDecision decide_act_consumer(const GraphView& g, NodeRef a, const CostPolicy& policy);

} // namespace memslim
