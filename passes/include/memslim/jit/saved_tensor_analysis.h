//===- saved_tensor_analysis.h - which values autograd keeps, in bytes -----===//
//
// What: for a TorchScript graph, which node inputs/outputs autograd keeps for
// backward (a table for the aten ops real models use; unknown ops keep all
// their tensor inputs, conservatively), and the byte size of a value when its
// type is a complete tensor type. Why: every rewrite's price is "bytes this
// node makes autograd keep", and whether a value is kept by someone else.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace memslim {

class SavedTensorAnalysis {
 public:
  // Whether `user` keeps its input number `index` for backward.
  static bool keeps_input(const torch::jit::Node* user, size_t index);
  // Whether `producer` keeps its (tensor) output for backward.
  static bool keeps_output(const torch::jit::Node* producer);

  // Some node other than `except` keeps `v` (as an input, or its producer as
  // its output), or keeps a view of it or the If output it is returned as;
  // `who` receives that node's kind for remarks.
  static bool kept_by_other(const torch::jit::Value* v, const torch::jit::Node* except,
                            std::string* who = nullptr);
  // The same with a set of nodes left out (a region about to be replaced).
  static bool kept_by_other(const torch::jit::Value* v,
                            const std::unordered_set<const torch::jit::Node*>& except,
                            std::string* who = nullptr);

  // Whether `n`'s output may be a view of (share storage with) its input
  // `index`, by its schema's alias annotations (view, reshape, transpose,
  // select..., and casts, which return their input when the dtype matches):
  // saved::may_alias_input, what the gate's alias checks read. Pricing reads
  // saved::is_view_of_input, for which a cast to another dtype is a copy.
  static bool is_view_of_input(const torch::jit::Node* n, size_t index);
  // Whether `n` may return its input itself although its schema declares no
  // alias: dropout and its variants return `input` when not training or p == 0
  // (ATen's _dropout_impl), in eager and in TorchScript's interpreter alike.
  static bool returns_input_undeclared(const torch::jit::Node* n);
  // Whether such a dropout node may return its input here: only a constant
  // `train == true` with a constant p > 0 rules it out.
  static bool may_return_input(const torch::jit::Node* d);
  // Whether TorchScript's peephole pass may replace `n`'s output by its input
  // (`x * 1`, `x / 1`, `x + 0`, `x - 0` with a scalar): with a constant, or with
  // a scalar computed from a loop's counter, which becomes one when the
  // executor unrolls the loop (long-fuzz seed 208175: `v0 * (i + 1)` kept by a
  // DifferentiableGraph as v0 itself, which silu_ then wrote).
  static bool may_fold_to_input(const torch::jit::Node* n);
  // The tensor whose storage `v` is: through views (pieces of chunk / split /
  // unbind included), in-place ops (which return what they wrote), dropouts
  // (which may return their input), ops the peephole pass may fold to their
  // input (may_fold_to_input) and If outputs a branch yields from outside. `through_dropout` (if
  // given) says whether the way passed such a dropout: an alias AliasDb cannot see; `dropouts` (if
  // given) receives those dropout nodes; `through_branch` (if given) whether it passed an If
  // output (then `v` may be another branch's tensor instead).
  static const torch::jit::Value* storage_root(
      const torch::jit::Value* v, bool* through_dropout = nullptr,
      std::vector<const torch::jit::Node*>* dropouts = nullptr, bool* through_branch = nullptr);
  // Whether `n` draws random numbers: torch's list (aten ops only, which is all
  // Node::isNondeterministic reads) and memslim's fused dropout.
  static bool draws_random(const torch::jit::Node* n);
  // Whether `n`, an in-place op by its schema, provably writes nothing: aten's
  // in-place dropouts return at once when p == 0 or not training (ATen's
  // _dropout_impl), here with a constant p == 0 or train == false (nn.Dropout's
  // p is a TorchScript constant: timm's TNT has `nn.Dropout(0., inplace=True)`
  // on softmax's output, which kept every gelu of its blocks).
  static bool writes_nothing(const torch::jit::Node* n);
  // Whether running `n` (a node without blocks) may do more than compute its
  // outputs: it writes in place, has side effects, draws random numbers, or has
  // no schema (a prim other than constants, GetAttr and list/tuple packing).
  static bool has_effects(const torch::jit::Node* n);
  // The values `n` writes in place (schema arguments marked `(a!)`; none where
  // writes_nothing).
  static std::vector<const torch::jit::Value*> written_inputs(const torch::jit::Node* n);

  // Bytes of `v` if its type has concrete sizes and a dtype.
  static std::optional<int64_t> bytes(const torch::jit::Value* v);
  static std::optional<int64_t> numel(const torch::jit::Value* v);
};

} // namespace memslim
