//===- recompute_blocks.h - blocks -> memslim::recompute_block --------------===//
//
// What: applying recompute-blocks decisions (core/recompute_blocks.h) to a
// TorchScript graph, shared by the recompute-blocks pass and the memory-budget
// planner; and the planner's entry point.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <functional>
#include <memory>
#include <vector>

#include "memslim/core/recompute_blocks.h"
#include "memslim/jit/pass.h"

namespace memslim {

// Submits each Rewrote block to ctx.gate (Kept ones become remarks). Call from
// inside a pass (run_pass sets the gate).
void apply_recompute_blocks(const std::shared_ptr<torch::jit::Graph>& g,
                            std::vector<RecomputeBlock>& blocks, PassContext& ctx);

// Moves attribute reads nested in an If (`if self.training`, a stochastic
// depth's p) before the If's top-level node, where their object is defined
// there and nothing in the graph writes attributes (prim::SetAttr): a read is
// pure, and a block cut around the If then reads the attribute's value (bool,
// float, int) instead of the module object, which cannot pass into the op.
void hoist_nested_attributes(torch::jit::Graph& g);

// Why `b` cannot be applied to the graph as it is ("" when it can): its text
// (a read of a type the op cannot carry), or ctx.gate's refusal.
std::string block_refusal(const std::shared_ptr<torch::jit::Graph>& g, const RecomputeBlock& b,
                          PassContext& ctx);

// Runs `plan` on `g` under ctx.policy.memory_budget (> 0; memory_budget.cpp):
// nothing when the graph already keeps at most the budget; else the plan's
// passes, then the block ladder's shortest prefix that meets it. Throws
// (c10::Error) when the budget is out of reach, naming the smallest reachable
// figure, or when sizes are unknown. `after` runs after each pass.
void run_with_memory_budget(const std::vector<const PassInfo*>& plan,
                            const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx,
                            const std::function<void(const PassInfo&)>& after = {});

} // namespace memslim
