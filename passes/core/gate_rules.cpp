//===- gate_rules.cpp - the safety gates' named rules ----------------------===//
//
// The table of gate_rules.h: names, summaries and which gate implements each
// rule. The checks themselves live with their gates (passes/safety_gate_rules.cpp,
// core/view_gate.cpp); the gtest suite holds the TorchScript gate's table to
// this order.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/gate_rules.h"

namespace memslim {

const std::vector<GateRuleInfo>& gate_rules() {
  using R = GateRule;
  constexpr unsigned kTs = kScriptGate, kBoth = kScriptGate | kFxGate;
  static const std::vector<GateRuleInfo> rules = {
      {R::EmptyProposal, "empty-proposal", "the proposal covers at least one node", kTs},
      {R::StaleNode, "stale-node",
       "every covered node is still in the graph (no earlier rewrite destroyed it)", kTs},
      {R::OneBlock, "one-block", "the covered nodes lie in one block", kTs},
      {R::InsideLoop, "inside-loop", "no covered node sits in a loop body", kTs},
      {R::NoSchema, "no-schema", "every covered non-prim node matches a registered schema", kTs},
      {R::WritesInPlace, "writes-in-place",
       "no covered node writes in place or has side effects, unless the rewrite removes the "
       "write or replays module-state writes",
       kTs},
      {R::ObservableWrite, "observable-write",
       "a write the rewrite removes is unobservable: a fresh tensor with no other reader", kBoth},
      {R::DeadCode, "dead-code",
       "the covered nodes' result reaches a return, a write, a side effect or a random op", kTs},
      {R::GradModeBetween, "grad-mode-between",
       "no with-block (grad mode, autocast) begins or ends between the covered nodes", kBoth},
      {R::ReplayedWrite, "replayed-write",
       "a covered write the rewrite replays touches no value the covered nodes read from outside",
       kTs},
      {R::NestedWrite, "nested-write",
       "a node nested in a covered If or Loop writes no value the covered nodes read from outside",
       kTs},
      {R::WriteBetween, "write-between",
       "between the first and the last covered node nothing writes what they read or make", kBoth},
      {R::WriteAfterGuarded, "write-after-guarded",
       "after the first covered node nothing writes a guarded value or an alias of one", kBoth},
      {R::CseTwin, "cse-twin",
       "an aten op the rewrite makes has no twin torch's CSE would merge it with across a "
       "with-block or a write through a dropout's undeclared alias",
       kTs},
      {R::ExecutorChainWrite, "executor-chain-write",
       "nothing writes in place, after the rewrite's executor chain has run, a tensor a "
       "DifferentiableGraph of that chain may keep",
       kTs},
      {R::HiddenAlias, "hidden-alias",
       "no write on one side of a dropout that may return its input meets a use on the other "
       "side (graph-wide)",
       kTs},
      {R::ExecutorHazard, "executor-hazard",
       "the graph is none TorchScript's executor fails on for some cuts into "
       "DifferentiableGraphs (graph-wide)",
       kTs},
  };
  return rules;
}

const GateRuleInfo& gate_rule(GateRule r) { return gate_rules()[static_cast<size_t>(r)]; }

const GateRuleInfo* find_gate_rule(const std::string& name) {
  for (const GateRuleInfo& r : gate_rules())
    if (name == r.name) return &r;
  return nullptr;
}

} // namespace memslim
