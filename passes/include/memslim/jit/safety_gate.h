//===- safety_gate.h - the one gate every rewrite goes through -------------===//
//
// What: passes do not edit the graph themselves; they *propose* a rewrite (the
// nodes whose computation it takes over, the values whose later in-place
// writes would break it, and a function that performs it) and the gate,
// owned by the pass driver, checks the proposal against the graph as it is
// at that moment and applies it, or refuses it with a remark. After the
// rewrite the gate drops covered nodes nobody reads any more.
// Why: each pass used to carry its own subset of the safety rules (output-
// saving checked later writers and loops, the dropout fusion and the
// canonicalizer checked nothing, the region pass rewrote from facts an earlier
// rewrite had made stale and crashed). One gate means every pass, present and
// future, gets every rule, and a rule fixed once is fixed everywhere.
// What it proves, with AliasDb (module state by attribute path, because
// AliasDb treats every attribute read as one wildcard):
//  - every covered node is still in the graph (not destroyed by an earlier
//    rewrite), they share one block, none sits in a loop body;
//  - no covered node writes anything (rewrites take over functional code),
//    unless the rewrite removes the write and nobody can observe it: the
//    written tensor is fresh (made by an op returning no alias; not a graph
//    input, module state or a view), with no reader but the writer;
//  - between the first and the last covered node, nothing outside the set
//    writes a value the covered nodes read or produce (the rewrite reads its
//    inputs once, at one place);
//  - after the first covered node, nothing writes a guarded value (what the
//    new op, or the original ops, keep for backward) or an alias of one;
//  - an aten op the rewrite makes has no twin (same kind, same input) that
//    torch's CSE would merge it with while a write AliasDb cannot see (through
//    a dropout returning its input) hits the twin;
//  - once the executor chain around the covered nodes has run (the nodes its
//    autodiff differentiates linked to them, which TorchScript's executor
//    runs as DifferentiableGraphs keeping what backward reads, outputs too),
//    nothing writes a tensor of that chain in place: the rewrite reshapes the
//    chain, and may make such a graph keep what the original did not.
// Aliases AliasDb cannot see count too: dropout and its variants return their
// input itself when not training or p == 0, with no alias in their schema.
// Each of these is a named rule (core/gate_rules.h lists them with the FX
// gate's); the checks and their table: safety_gate_rules.cpp. A refusal names
// its rule, and the kept decision records it (Decision::rule).
// The driver (run_pass) runs each pass as a transaction: the graph is linted
// after the pass; if the pass throws or the lint fails, the graph is restored
// and the pass's remarks are replaced by one `rolled back` remark (in strict
// mode, used by tests and memslim-opt --verify, the error propagates).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "memslim/core/gate_rules.h"
#include "memslim/jit/pass.h"

namespace memslim {

class Remarks;

struct Proposal {
  // For remarks: "aten::gelu at %h", "region of 3 ops at %y".
  std::string site;
  // The nodes whose computation the rewrite takes over (one block, any order).
  // After the rewrite, those whose outputs nobody reads are destroyed.
  std::vector<torch::jit::Node*> covers;
  // Values whose in-place write after the first covered node would make the
  // rewrite wrong or fail in backward: what the new op keeps (and what the
  // original ops kept, so an error aten would raise is not turned into
  // silence).
  std::vector<torch::jit::Value*> guarded;
  // Performs the rewrite: inserts the new node(s) and moves every outside use
  // of the covered outputs to them. Returns "" or why it could not (then it
  // must have left the graph unchanged).
  std::function<std::string()> apply;
  // The remark line (without "remark: <pass>: ") once applied.
  std::string rewrote;
  // The cost model's figures, carried into the decision record (rewrote or kept).
  Price price;
  // The rewrite replaces covered in-place ops by functional ones: allowed only
  // where nobody can observe the write (the written tensor is fresh, has no
  // alias and no other reader).
  bool removes_writes = false;
  // The new op runs the covered nodes itself, writes included, and replays
  // them in backward on copies of what they write (recompute_block,
  // coupling_chain): covered nodes may write module state (BatchNorm's running
  // stats, as memslim's norms declare them), nothing else.
  bool replays_writes = false;
  // The ops the rewrite inserts that torch's CSE could merge with the user's
  // own (kind, first input): aten ops (a canonical form, the functional form of
  // an in-place op), not memslim's. The gate checks their twins.
  std::vector<std::pair<c10::Symbol, torch::jit::Value*>> makes;
};

// A proposal for "node `n` becomes `kind`, same inputs" (the output-saving
// swaps): covers n, guards `guarded`, moves n's output to the new node; the
// remark and price come from the core's Rewrote decision `d`.
Proposal swap_proposal(const std::shared_ptr<torch::jit::Graph>& g, torch::jit::Node* n,
                       const std::string& kind, std::vector<torch::jit::Value*> guarded,
                       const Decision& d);

class SafetyGate {
 public:
  SafetyGate(std::shared_ptr<torch::jit::Graph> graph, std::string pass, Remarks& remarks);
  ~SafetyGate();

  // Whether `n` is (still) a node of the graph: passes that collected sites
  // before rewriting ask before touching one.
  bool alive(const torch::jit::Node* n) const { return live_.count(n) > 0; }

  // Checks `p` against the graph as it is now and applies it, or records a
  // `kept <site>: <reason>` remark. Returns whether it was applied.
  bool submit(const Proposal& p);

  // Why `p` may not be applied now: the first failing rule's name and reason
  // (the table of safety_gate_rules.cpp, walked in order), or nullopt when it
  // may.
  std::optional<Refusal> named_refusal(const Proposal& p);
  // The same refusal's reason alone.
  std::optional<std::string> refusal(const Proposal& p);

  // The rules named_refusal() checks, in its order.
  static std::vector<GateRule> rules();

  // How many proposals were applied / refused so far.
  int applied() const { return applied_; }
  int refused() const { return refused_; }

 private:
  friend class GateCheck; // one refusal's view of the gate (safety_gate_rules.cpp)
  void refresh();
  torch::jit::AliasDb& alias();
  const torch::jit::Node* hidden_writer(const torch::jit::Value* v);
  const std::optional<std::string>& hidden_alias_read();
  const std::optional<std::string>& executor_hazard();
  bool live(const torch::jit::Value* v);

  std::shared_ptr<torch::jit::Graph> graph_;
  std::string pass_;
  Remarks& remarks_;
  std::unique_ptr<torch::jit::AliasDb> alias_;
  std::unordered_set<const torch::jit::Node*> live_;
  // hidden_alias_read()'s answer for the graph as it is (reset by refresh()).
  std::optional<std::optional<std::string>> hidden_read_;
  // executor_hazard()'s answer for the graph as it is (reset by refresh()).
  std::optional<std::optional<std::string>> executor_hazard_;
  // Values the graph's results or effects depend on (live()); reset by refresh().
  std::optional<std::unordered_set<const torch::jit::Value*>> live_values_;
  int applied_ = 0, refused_ = 0;
};

// The attribute path ("self.block.order") of module state `v` reads, through
// view-like ops, or "" when `v` is not module state.
std::string module_state_path(const torch::jit::Value* v);

// Replaces the contents of `g` with a copy of `src` (the driver's rollback).
void restore_graph(torch::jit::Graph& g, torch::jit::Graph& src);

} // namespace memslim
