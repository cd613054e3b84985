//===- pass_table.h - every pass and pipeline, declared once ---------------===//
//
// What: the one table of memslim's passes (flag, summary, the policy options it
// reads, where each front end runs it) and the pipelines as data: ordered
// steps, each with the reason it sits there and, where a front end runs a
// different list, the difference and its reason beside the step. memslim-opt
// (--list-passes, --pipeline), the TorchScript registry, the FX front end and
// the torch.compile backend all read these rows; a front end supplies
// the implementation of each row (jit/pass_registry.cpp, fx/fx_front_end.cpp),
// except for a row whose rewrite is a swap (SwapRule) or a formula
// (FormulaRule: the site and the nodes feeding it become one op with new
// arguments): its site finder and decision are in the row, and each front end
// applies every such row by one driver (run_swap_pass / run_formula_pass in
// both), so such a pass is a core file, a row and a lit file.
// Why: a pass used to be declared in two registries and three default
// pipelines (C++ TorchScript, C++ FX, Python compile), which drifted apart.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

// The ways a graph reaches the passes: TorchScript (memslim.optimize,
// memslim-opt on .pt / IR), FX (torch.export's program: memslim.fx.optimize,
// memslim-opt on .pt2), and FX under torch.compile (the backend, which hands
// the partitioner recompute tags where the others build ops).
enum class FrontEnd { Jit, Fx, Compile };
const char* front_end_name(FrontEnd f); // "TorchScript", "FX", "torch.compile"

// The rewrite kind "swap": the site's op becomes `kind` (its default
// overload) with the same arguments. guarded: the values whose later in-place
// write the gate refuses (what aten kept, what the new op keeps).
struct SwapDecision {
  Decision decision;
  std::string kind; // "memslim::gelu"
  std::vector<ValueRef> guarded;
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
// A swap pass's site finder and decision (core functions; nullptr: the row is
// not a swap pass and its front ends implement it).
struct SwapRule {
  bool (*is_site)(const GraphView&, NodeRef) = nullptr;
  SwapDecision (*decide)(const GraphView&, NodeRef, const CostPolicy&) = nullptr;
};

// The rewrite kind "formula": the site (the last node of `covers`) becomes `op`
// (its default overload) with new arguments, each a value of the graph or a
// constant; the covered nodes nobody reads any more go. guarded as for a swap.
struct FormulaArg {
  ValueRef value;                      // set for a graph value
  std::optional<c10::IValue> constant; // set for a constant
  std::string name;                    // how the constant is named: "reduction"
};
// A covered node that stays (others read it) as another op of the same
// arguments: the loss head's linear whose logits the graph also returns.
struct FormulaSwap {
  NodeRef node;
  std::string kind; // "memslim::linear"
};
struct FormulaDecision {
  Decision decision;
  std::string op; // "memslim::linear_cross_entropy"
  std::vector<FormulaArg> args;
  std::vector<NodeRef> covers; // producers first, the site last
  std::vector<ValueRef> guarded;
  std::vector<FormulaSwap> swaps; // applied after the site's rewrite
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
struct FormulaRule {
  bool (*is_site)(const GraphView&, NodeRef) = nullptr;
  FormulaDecision (*decide)(const GraphView&, NodeRef, const CostPolicy&) = nullptr;
};

struct PassSpec {
  const char* flag;    // kebab-case: the lit file's name, the remark's prefix
  const char* summary; // one sentence for --list-passes
  // The CostPolicy options its decisions read (policy_options() names).
  std::vector<const char*> options;
  // "" where the FX front end runs it; else why not (said by a Note record
  // when the pass is asked for by name).
  const char* fx_absent;
  // Set for a swap pass: the whole pass (see SwapRule).
  SwapRule swap = {};
  // Set for a formula pass: the whole pass (see FormulaRule).
  FormulaRule formula = {};
};

struct PipelineStep {
  const char* pass;
  const char* why; // why the step sits here (the order's reason)
  // Where a front end leaves the step out: "" (every front end runs it), or
  // the reason the FX front end skips it (fx_skip) / the compile backend does
  // (compile_skip, which defaults to fx_skip's choice).
  const char* fx_skip = "";
  const char* compile_skip = "";
};

struct PipelineSpec {
  const char* name;
  const char* summary;
  std::vector<PipelineStep> steps;
  // The flags `front_end` runs, in order.
  std::vector<std::string> passes(FrontEnd front_end) const;
};

const std::vector<PassSpec>& pass_table();
const std::vector<PipelineSpec>& pipeline_table();
const PassSpec* find_pass_spec(const std::string& flag);
const PipelineSpec* find_pipeline_spec(const std::string& name);
// The flags to run: `passes` when given (each checked), else `pipeline`'s for
// `front_end`. Throws std::invalid_argument naming an unknown pass / pipeline.
std::vector<std::string> resolve_pipeline(const std::vector<std::string>& passes,
                                          const std::string& pipeline, FrontEnd front_end);

} // namespace memslim
