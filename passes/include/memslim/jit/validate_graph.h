//===- validate_graph.h - reject graphs that no pass can analyse ------------===//
//
// What: a check to run on a graph before any pass builds an AliasDb or the
// interpreter runs it: every node is a prim the JIT handles structurally (with
// the blocks, inputs and outputs that prim needs) or matches a registered
// operator schema for its argument types, and the graph lints.
// Why: an unknown op or a wrong argument type in IR text otherwise surfaces as
// torch's "INTERNAL ASSERT FAILED ... please report a bug to PyTorch" deep in
// AliasDb, naming neither the op's position nor the user's mistake; a node
// whose output count disagrees with its schema can unbalance the interpreter's
// stack.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <optional>
#include <string>

namespace memslim {

// nullopt when the graph is fine; otherwise one line naming the first bad node
// and its position, e.g. "unknown op aten::frobnicate at line 3, column 17" or
// "aten::relu at line 2, column 13: no schema accepts its argument types (int);
// candidates: aten::relu(Tensor self) -> Tensor". Positions come from the
// node's source range (parseIR sets them); without one the node is printed.
// Schema-less prims are those a module's method graph holds (If, Loop,
// constants, tuple/list/dict nodes, attributes, calls, Print, fork/wait, ...),
// each checked for its shape; the graph executor's internal nodes (profile,
// TypeCheck, fusion groups, BailOut, PythonOp, ...) only with
// `executor_nodes` (parseIR cannot build them runnable: prim::PythonOp read
// from text crashes the process).
std::optional<std::string> validate_graph(const std::shared_ptr<torch::jit::Graph>& graph,
                                          bool executor_nodes = false);

// Throws c10::Error with validate_graph's line when the graph is invalid.
void check_graph(const std::shared_ptr<torch::jit::Graph>& graph, bool executor_nodes = false);

} // namespace memslim
