//===- pass.h - pass interface, policy, remarks, registry ------------------===//
//
// What: the signature every memslim pass has, the cost policy knobs, the
// decision records (one per site: verdict, site, reason, price; rendered as
// `remark: <pass>: rewrote|kept ...`), and
// the explicit registry of passes and pipelines (a list, no static
// initialisers: the linker cannot drop a pass, and the order is visible).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"
#include "memslim/core/pass_table.h"

namespace memslim {

// Resolves the policy's automatic settings against the current torch.jit state.
CostPolicy resolved(CostPolicy p);

class SafetyGate;

struct PassContext {
  CostPolicy policy;
  Remarks remarks;
  // Set by run_pass while a pass runs: every rewrite goes through it.
  SafetyGate* gate = nullptr;
  // Tests and memslim-opt --verify: a pass that throws or leaves a graph that
  // does not lint is an error, not a silent rollback.
  bool strict = false;
  // for_each_site's (core/site_loop.h) `alive` and `record` in this front end:
  // a node is alive while the gate has it; decisions go to the remarks.
  std::function<bool(NodeRef)> alive() const;
  std::function<void(Decision)> record();
};

using PassFn = std::function<void(const std::shared_ptr<torch::jit::Graph>&, PassContext&)>;

struct PassInfo {
  const char* flag; // kebab-case, = its lit file name
  const char* description;
  PassFn run;
};

struct PipelineInfo {
  const char* name;
  const char* description;
  std::vector<std::string> passes;
};

const std::vector<PassInfo>& registered_passes();
const std::vector<PipelineInfo>& registered_pipelines();
const PassInfo* find_pass(const std::string& flag);
const PipelineInfo* find_pipeline(const std::string& name);
// The passes to run: `passes` when given, else `pipeline`'s. Throws
// std::invalid_argument naming the unknown pass or pipeline.
std::vector<const PassInfo*> resolve_plan(const std::vector<std::string>& passes,
                                          const std::string& pipeline);

// Runs pass `p` on `g` as a transaction: through a SafetyGate (ctx.gate),
// linted afterwards; a pass that throws or breaks the graph is rolled back
// (graph restored, its remarks replaced by one `rolled back` remark) unless
// ctx.strict, where the error propagates.
void run_pass(const PassInfo& p, const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);

// Inserts `kind(inputs)` before `old` (one output, `old_output`'s type and
// metadata), redirects every use of `old_output` to it, and returns the new node.
// Shared by the rewriting passes; destroying `old` is left to the caller.
torch::jit::Node* replace_output(torch::jit::Graph& g, torch::jit::Node* old,
                                 torch::jit::Value* old_output, c10::Symbol kind,
                                 at::ArrayRef<torch::jit::Value*> inputs);

// Whether `n` sits in a prim::Loop body (the passes do not analyse loops).
bool inside_loop(const torch::jit::Node* n);

// A swap pass of the core's table (core/pass_table.h, SwapRule): each site the
// rule decides Rewrote becomes the new op through the SafetyGate, guarding the
// decision's values (output-saving-activations, output-saving-norms,
// max-pool-positions; jit/pass_registry.cpp).
void run_swap_pass(const SwapRule& rule, const std::shared_ptr<torch::jit::Graph>& g,
                   PassContext& ctx);

// A formula pass of the core's table (FormulaRule): each site the rule
// decides Rewrote becomes the decision's op with its arguments through the
// SafetyGate (fuse-loss-head; jit/pass_registry.cpp).
void run_formula_pass(const FormulaRule& rule, const std::shared_ptr<torch::jit::Graph>& g,
                      PassContext& ctx);

// The passes with a rewrite of their own (one file each).
void run_functionalize_inplace_activations(const std::shared_ptr<torch::jit::Graph>& g,
                                           PassContext& ctx);
void run_canonicalize_activations(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_fuse_activation_dropout(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_recompute_pointwise_regions(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_invertible_couplings(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_recompute_blocks(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_fuse_activation_consumer(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_canonicalize_norms(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_fuse_residual_join(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_remove_identity_dropouts(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_cleanup(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_test_perturb_outputs(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);

} // namespace memslim
