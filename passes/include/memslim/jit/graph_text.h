//===- graph_text.h - a subgraph as the text a memslim op carries -----------===//
//
// What: the text of a graph cut out of a model for an op that carries it as a
// `str` argument and parses it at run time (memslim::recompute_region,
// memslim::coupling_chain, memslim::recompute_block): module scopes dropped (the printer writes
// them, parseIR cannot read them), shapes erased, statements without outputs written the way
// parseIR reads them, and checked to parse back. Why: parseIR cannot read Subgraph attributes; both
// passes emitting such ops need the same text and the same check.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "memslim/core/top_level.h"

namespace memslim {

// The text of `g` (its scopes and shapes cleared in place), or nullopt with
// `error` set to the parser's first line when it does not parse back.
std::optional<std::string> op_graph_text(const std::shared_ptr<torch::jit::Graph>& g,
                                         std::string* error);

// A function cut out of the top-level block (FunctionCut of a JitGraphView) as
// the text of a graph (data, external...) -> result (result, result2 where
// the cut has a second output): nested blocks kept,
// constants copied in, bool / int / float reads passed as 0-dim tensors and
// unboxed inside, Tensor? passed as is; with `strs`, str reads become the
// function's last inputs, in order (recompute_block's str[] argument). Returns
// "" and sets `text`, or why not (a read of another type; text that does not
// parse back).
std::string cut_function_text(const FunctionCut& fn, std::string& text, bool strs = false);

// Whether external value `v` passes as a str (cut_function_text with `strs`).
bool passes_as_str(const torch::jit::Value* v);

// The op's argument for external value `v` of a cut function, inserted at the
// graph's insert point where it must be boxed (bool / int / float -> 0-dim tensor).
torch::jit::Value* cut_argument(torch::jit::Graph& g, torch::jit::Value* v);

// The `Tensor?[]` state argument of an op carrying cut functions: each external
// value through cut_argument, inserted at the graph's insert point.
torch::jit::Value* insert_state_list(torch::jit::Graph& g,
                                     const std::vector<torch::jit::Value*>& state);

// `now` takes `old`'s type and metadata and every use of `old` outside the
// covered top-level nodes (a use in a nested block counts as its owner's).
void redirect_outside_uses(torch::jit::Value* old, torch::jit::Value* now,
                           const std::unordered_set<const torch::jit::Node*>& covered);

} // namespace memslim
