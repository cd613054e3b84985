//===- safety_gate_detail.h - what the SafetyGate's files share -------------===//
//
// What: the helpers the TorchScript gate's three files share: the gate itself
// (safety_gate.cpp), its rules and their table (safety_gate_rules.cpp), and
// its model of TorchScript's executor (safety_gate_executor.cpp). Not for
// passes: they go through SafetyGate::submit.
// Why: one gate, split by topic so that each file and each rule reads on its own.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace memslim::gate_detail {

inline std::string name_of(const torch::jit::Value* v) { return "%" + v->debugName(); }

// relu6 and hardtanh: differentiated by the executor although
// torch::jit::isDifferentiable says no (safety_gate_executor.cpp).
bool clamping_activation(const torch::jit::Node* n);

// The nodes TorchScript's executor may put in one DifferentiableGraph with the
// covered nodes `covers` (`members`: the same, as a set): the covered nodes
// and every differentiable node linked to them (safety_gate_executor.cpp).
std::vector<const torch::jit::Node*> executor_chain(
    const std::vector<torch::jit::Node*>& covers,
    const std::unordered_set<const torch::jit::Node*>& members,
    const std::shared_ptr<torch::jit::Graph>& graph);

} // namespace memslim::gate_detail
