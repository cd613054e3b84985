//===- gate_test_util.h - small IR graphs and proposals for the gate tests -===//
//
// What: parse IR text, find a node by kind, and propose swapping one node for
// another op: what safety_gate_test.cpp and gate_rules_test.cpp build their
// cases from.
// Why: one copy of the helpers for the gate's two test files.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/irparser.h>

#include <memory>
#include <string>

#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace gate_test {

using memslim::Proposal;
using torch::jit::Graph;
using torch::jit::Node;

inline std::shared_ptr<Graph> parse(const std::string& ir) {
  auto g = std::make_shared<Graph>();
  torch::jit::parseIR(ir, g.get());
  return g;
}

// The first node of `kind` (depth first), or nullptr.
inline Node* find(const std::shared_ptr<Graph>& g, const char* kind, int nth = 0) {
  torch::jit::DepthFirstGraphNodeIterator it(const_cast<std::shared_ptr<Graph>&>(g));
  for (Node* n = it.next(); n; n = it.next())
    if (n->kind() == c10::Symbol::fromQualString(kind) && nth-- == 0) return n;
  return nullptr;
}

// A proposal replacing `n` (one output) by `kind` with the same inputs.
inline Proposal swap(const std::shared_ptr<Graph>& g, Node* n, const char* kind) {
  Proposal p;
  p.site = std::string(n->kind().toQualString()) + " at %" + n->output()->debugName();
  p.covers = {n};
  p.guarded = {n->input(0), n->output()};
  p.apply = [g, n, kind]() {
    memslim::replace_output(*g, n, n->output(), c10::Symbol::fromQualString(kind), n->inputs());
    return std::string();
  };
  p.rewrote = "swapped";
  return p;
}

} // namespace gate_test
