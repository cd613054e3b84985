//===- gate_rules.h - the safety gates' named rules (front-end neutral) ----===//
//
// What: the one list of the rules a rewrite must pass before it is applied,
// each a kebab-case name, a one-line summary of what it proves, and which gate
// implements it: the TorchScript gate (SafetyGate, passes/safety_gate_rules.cpp)
// checks them in this order, the first failing rule's reason is the refusal;
// the FX gate (ViewGate, core/view_gate.cpp) checks the subset its graphs need
// under the same names. A refusal carries the rule's name beside its reason,
// and the decision record keeps it (Decision::rule).
// Why: the two gates used to check overlapping rules each its own way, with
// nothing to say which check of one was which of the other; named rules make
// a refusal say which rule kept a site, and the table says where each rule
// lives.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

namespace memslim {

// In the order the TorchScript gate checks them.
enum class GateRule {
  EmptyProposal,
  StaleNode,
  OneBlock,
  InsideLoop,
  NoSchema,
  WritesInPlace,
  ObservableWrite,
  DeadCode,
  GradModeBetween,
  ReplayedWrite,
  NestedWrite,
  WriteBetween,
  WriteAfterGuarded,
  CseTwin,
  ExecutorChainWrite,
  HiddenAlias,
  ExecutorHazard,
};

// Which gates implement a rule (a bit set).
enum GateKind : unsigned { kScriptGate = 1u, kFxGate = 2u };

struct GateRuleInfo {
  GateRule id;
  const char* name;    // "write-after-guarded"
  const char* summary; // what passing it proves, one line
  unsigned gates;      // GateKind bits
};

// Every rule, in GateRule order.
const std::vector<GateRuleInfo>& gate_rules();
const GateRuleInfo& gate_rule(GateRule r);
// The rule named `name`, or nullptr.
const GateRuleInfo* find_gate_rule(const std::string& name);

// Why a gate refuses a rewrite: the rule's name and the remark's reason.
struct Refusal {
  std::string rule;
  std::string reason;
};
inline Refusal refuse(GateRule r, std::string reason) {
  return {gate_rule(r).name, std::move(reason)};
}

} // namespace memslim
