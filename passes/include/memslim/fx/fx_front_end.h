//===- fx_front_end.h - memslim's passes over an aten-level FX graph -------===//
//
// What: runs the decisions the FX front end has over an FxGraphView and says
// which nodes to rewrite to which memslim op; python/memslim/fx.py applies
// them to the torch.fx graph. Each pass here is the core's decision (the same
// function the TorchScript pass calls) behind the ViewGate.
// Passes with no FX form yet get one Note record saying so. A recompute
// region is handed back as an FxRegion: fx.py builds the op from it, or, under
// torch.compile, tags the region's nodes for Inductor's partitioner instead.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/fx/fx_graph_view.h"

namespace memslim {

// One argument of a rewritten node: a value of the graph, or a constant.
struct FxArg {
  std::optional<size_t> value; // FxGraphView value id
  c10::IValue constant;        // when no value
};
// A recompute region replaced by one memslim::recompute_region node.
struct FxRegion {
  std::vector<size_t> nodes;       // the region's nodes, program order (they go)
  std::vector<size_t> inputs;      // value ids: the op's tensor list
  std::vector<size_t> outputs;     // value ids read outside the region...
  std::vector<size_t> new_outputs; // ...which the op's outputs replace (the view's ids)
  size_t before = 0;               // node id the op goes just before
  std::string ir;                  // the op's graph text
};
struct FxRewrite {
  size_t node;          // FxGraphView node id
  std::string kind;     // "memslim::gelu"
  std::string overload; // "" (the default overload)
  // The new arguments; absent: the same arguments as before (another op of the
  // same signature).
  std::optional<std::vector<FxArg>> args;
  // Nodes the rewrite left without readers, consumers first: they go.
  std::vector<size_t> erased;
  // Set for a recompute region (`node` is then the op's new node id).
  std::optional<FxRegion> region;
};
// The memory-budget planner's block ladder over the graph the passes left
// (core/recompute_blocks.h), for a front end that applies a step as
// recompute tags and measures it (memslim's torch.compile backend): steps[0]
// recomputes nothing; each later step recomputes `runs` (each run's nodes, view
// node ids, program order). Independent of the budget.
struct FxLadderStep {
  int64_t kept = 0, peak = 0; // predicted by the cost model
  double flops = 0;           // added forward work
  std::string move;
  std::vector<std::vector<size_t>> runs;
  bool light = true; // no convolution or matrix product re-runs (LadderStep::light)
};
struct FxLadder {
  std::string why;                  // "" or why there is no ladder
  size_t segments = 0;              // blocks found
  std::vector<std::string> refused; // "block at %v: why", for blocks the gate refused
  std::vector<FxLadderStep> steps;
};
// A coupling chain invertible-couplings found (core/couplings.h): the FX
// graph has no op that carries F and G as graph text, so the front end hands
// back the nodes the chain covers and memslim's torch.compile backend runs
// them as a piece of their own through the TorchScript pass (backend.py).
struct FxChain {
  std::vector<size_t> covers; // node ids, program order
  int64_t kept_before = 0, kept_after = 0;
};
struct FxResult {
  std::vector<Decision> decisions;
  std::vector<FxRewrite> rewrites;
  std::vector<FxChain> chains; // Rewrote chains, behind the view gate
  // When the policy has a memory budget: the ladder over whole blocks
  // (ApplyAs::Op's prices) and the one over their pieces (ApplyAs::Tags).
  std::optional<FxLadder> ladder, pieces;
};

// The passes the FX front end runs when none are named.
const std::vector<std::string>& fx_default_passes();
// Which block ladders run_fx builds under a memory budget: each costs a greedy
// walk that re-prices every move at every step (TinyDecoder, 32 blocks: ~7 s),
// so a caller asks only for those it reads.
enum class FxLadders { Both, Op, Tags, None };

// Runs `passes` (flags, in order) over `g`, then, when the policy has a
// memory budget, builds the block ladders named by `ladders` over what they
// left. Throws std::invalid_argument for a flag no pass has.
FxResult run_fx(FxGraphView& g, const std::vector<std::string>& passes, const CostPolicy& policy,
                FxLadders ladders = FxLadders::Both);

} // namespace memslim
