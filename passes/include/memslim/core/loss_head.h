//===- loss_head.h - cross_entropy(linear(h, W)) without the logits --------===//
//
// What: whether a loss head, aten::cross_entropy_loss of class-index targets
// over the logits of aten::linear(h, W, b) (through a float cast and a view
// flattening the tokens, as transformers' loss functions write it), should
// become memslim::linear_cross_entropy (runtime/loss_head_ops.cpp), which
// computes the loss a chunk of tokens at a time and keeps neither the logits
// nor log_softmax's output. A formula pass (core/pass_table.h FormulaRule):
// the cross_entropy node becomes the op, the cast and view and the linear go
// unless something else reads them. Where something does (transformers
// returns the logits), the linear stays as memslim::linear (a FormulaSwap:
// aten's linear whose backward skips an undefined or all-zero gradient) and
// the op reads its output (`logits`) in place of its own forward matmul: the
// head's three matmuls, nothing logits-sized kept; the remark names the form.
// Priced from what autograd keeps: aten keeps log_softmax's output (tokens x
// vocabulary) and the linear's input; the op keeps the input's and weight's
// gradients (a scalar loss: computed in forward, three matmuls as aten's) or,
// where those would be larger than the logits (few tokens, a wide weight) or
// the loss is per token, the input, the targets and one float per token
// (backward recomputes the logits: a fourth matmul).
// Why here: both front ends decide with this function.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/core/pass_table.h"

namespace memslim {

inline constexpr const char* kLossHeadPass = "fuse-loss-head";

// Whether `n` is aten::cross_entropy_loss with its six arguments.
bool is_loss_head_site(const GraphView& g, NodeRef n);
FormulaDecision decide_loss_head(const GraphView& g, NodeRef n, const CostPolicy& policy);

} // namespace memslim
