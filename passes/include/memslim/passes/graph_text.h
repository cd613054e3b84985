//===- graph_text.h - a subgraph as the text a memslim op carries -----------===//
//
// What: the text of a graph cut out of a model for an op that carries it as a
// `str` argument and parses it at run time (memslim::recompute_region,
// memslim::coupling_chain): module scopes dropped (the printer writes them,
// parseIR cannot read them), shapes erased, statements without outputs written
// the way parseIR reads them, and checked to parse back.
// Why: parseIR cannot read Subgraph attributes; both passes emitting such ops
// need the same text and the same check.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <optional>
#include <string>

namespace memslim {

// The text of `g` (its scopes and shapes cleared in place), or nullopt with
// `error` set to the parser's first line when it does not parse back.
std::optional<std::string> op_graph_text(const std::shared_ptr<torch::jit::Graph>& g,
                                         std::string* error);

} // namespace memslim
