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
#include "memslim/core/fx_graph_view.h"

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
struct FxResult {
  std::vector<Decision> decisions;
  std::vector<FxRewrite> rewrites;
};

// The passes the FX front end runs when none are named.
const std::vector<std::string>& fx_default_passes();
// Runs `passes` (flags, in order) over `g`. Throws std::invalid_argument for
// a flag no pass has.
FxResult run_fx(FxGraphView& g, const std::vector<std::string>& passes, const CostPolicy& policy);

} // namespace memslim
