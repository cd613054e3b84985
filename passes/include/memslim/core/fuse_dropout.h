//===- fuse_dropout.h - dropout(act(x)) -> one memslim op, any view --------===//
//
// What: whether aten::dropout(act(x), p, train), with act an aten activation
// memslim keeps by its output (gelu, silu, mish, hardswish, softplus, elu,
// celu, selu, sigmoid, tanh) whose output nothing else reads, should become
// memslim::activation_dropout(x, act, params, p, train, instance): it keeps
// its output plus 2 bits per element (dropout's mask and the activation's
// branch) instead of the activation's input and dropout's noise or mask.
// Why: nn.TransformerEncoderLayer, torchvision's ViT MLP and timm's Mlp put
// dropout between the activation and the next linear, so output-saving the
// activation alone frees nothing there (dropout keeps its noise, the linear
// keeps dropout's output).
// Cost: aten keeps x (unless another consumer does) + dropout's float noise
// (eager autograd) or bool mask (TorchScript's optimising executor:
// CostPolicy::dropout_mask_bytes); memslim keeps the output (unless its
// consumer does) + n/4 bytes. The TorchScript pass
// (passes/fuse_activation_dropout.cpp) and the FX front end both decide here.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>

#include "memslim/core/act_spec.h"
#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kFuseDropoutPass = "fuse-activation-dropout";
inline constexpr const char* kActivationDropout = "memslim::activation_dropout";

// The kernel activation and parameters of aten activation `a` when its
// arguments are constants (the runtime's own spec functions, so celu/selu/gelu
// map exactly as the ops do); nullopt otherwise. Shared by the fusions that
// take an activation as `str act, float[] params`.
std::optional<ActSpec> activation_spec_of(const GraphView& g, NodeRef a);

// Whether `d` is an aten::dropout of an aten activation with an output-keeping
// memslim kernel (the mask-only kernels keep no output to fuse with).
bool is_fuse_dropout_site(const GraphView& g, NodeRef d);

struct FuseDropoutDecision {
  Decision decision;   // Rewrote (sentence, price) or Kept (why)
  NodeRef act;         // the activation (goes with the rewrite)
  ValueRef x;          // its input: the fused op's first argument
  ActSpec spec;        // the kernel activation and its parameters
  ValueRef guarded[3]; // x (aten kept it), the activation's output, dropout's output
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
// The decision at site `d`. `policy.dropout_mask_bytes` < 0 prices what eager
// autograd keeps: a bool mask on CUDA, float noise elsewhere.
FuseDropoutDecision decide_fuse_dropout(const GraphView& g, NodeRef d, const CostPolicy& policy);

// One more than the largest `instance` of the graph's fused ops: each fused op
// of a graph gets its own, so TorchScript's CSE (which does not know the op
// draws random numbers) never sees two equal nodes (runtime/schema.cpp).
int64_t next_dropout_instance(const GraphView& g);

} // namespace memslim
