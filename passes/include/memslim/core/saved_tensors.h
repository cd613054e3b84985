//===- saved_tensors.h - which values autograd keeps, over a GraphView ------===//
//
// What: for any GraphView, which node inputs/outputs autograd keeps for
// backward (a table for the aten ops real models use, after
// tools/autograd/derivatives.yaml; unknown ops keep all their tensor inputs,
// conservatively) and whether a value is kept by someone other than the node
// being priced. Why: every rewrite's price is "bytes this node makes autograd
// keep", written once for both front ends (SavedTensorAnalysis's TorchScript
// entry points call these through a JitGraphView).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <unordered_set>

#include "memslim/core/graph_view.h"

namespace memslim::saved {

using NodeSet = std::unordered_set<NodeRef, NodeRefHash>;

// Whether `user` keeps its input number `index` for backward.
bool keeps_input(const GraphView& g, NodeRef user, size_t index);
// Whether `producer` keeps its (tensor) output for backward.
bool keeps_output(const GraphView& g, NodeRef producer);
// Some node outside `except` keeps `v`'s storage (as an input, or its producer
// as its output), or keeps a view of it or the If output it is returned as;
// `who` receives that node's kind for remarks. `surely`: only readers that
// surely keep `v`'s own bytes count: none in an If's branch or a loop's body
// below `v`'s block (nn.TransformerEncoder's last norm output is read by the
// nested-tensor branch's to_padded_tensor, which a training step never runs),
// none that may keep a copy instead (keeps_copy_of_input): what pricing "kept
// anyway, so keeping it costs nothing" needs. Without it (whether aten's op
// keeps bytes another may keep too) any reader counts.
bool kept_by_other(const GraphView& g, ValueRef v, const NodeSet& except,
                   std::string* who = nullptr, bool surely = false);
// Whether `user` may keep a copy of its input `index` rather than that tensor:
// aten::linear / matmul (with a matrix) fold a >= 3-D input to 2-D with
// reshape, which copies a non-contiguous one (torch's should_fold folds
// whenever the weight requires grad; mm then keeps the copy).
// nn.MultiheadAttention's in_proj on `query.transpose(1, 0)` (batch_first)
// keeps such a copy, not the norm output it reads (measured with
// saved_tensors_hooks: a (1024, 256) _unsafe_view of a new storage). Only
// "may": TorchScript's executor, where it puts the linear in a
// DifferentiableGraph, keeps the input itself (its symbolic gradient reshapes
// in backward); and judged by contiguity where the front end knows it, a
// non-contiguous input whose leading dims still fold to a view (a slice of the
// last dim) is counted too.
bool keeps_copy_of_input(const GraphView& g, NodeRef user, size_t index);
// Whether `user` keeps a copy of its input `index` in another dtype, never
// that tensor: a matrix product or conv (linear, matmul, mm, conv*, ...) whose
// output is bf16 / fp16 while the input is another floating dtype keeps
// autocast's 16-bit copy of it (a graph traced above autocast shows the op
// reading the float32 value; its output's dtype tells). Sure, unlike
// keeps_copy_of_input's "may": the op cannot compute in 16-bit from a float32
// operand without the cast.
bool keeps_cast_copy_of_input(const GraphView& g, NodeRef user, size_t index);
// Whether `n`'s output is a view of (shares storage with) its input `index`,
// by its schema's alias annotations (view, reshape, transpose, select...),
// less the casts whose schema says `Tensor(a) -> Tensor(a)` because a cast to
// the same dtype returns its input: one to another dtype (the known dtypes of
// input and output differ: TorchScript's autocast casts, aten::to) is a new
// tensor. What pricing reads; the safety rules read may_alias_input.
bool is_view_of_input(const GraphView& g, NodeRef n, size_t index);
// Whether `n`'s output may share storage with its input `index`, by the
// schema's alias annotations alone (a cast counts: at run time it may be a
// no-op). What the safety rules (writes through aliases) read.
bool may_alias_input(const GraphView& g, NodeRef n, size_t index);
// Whether `n` is a dtype cast whose output's known dtype differs from its
// input's (so it made a new tensor).
bool casts_to_another_dtype(const GraphView& g, NodeRef n);
// Whether a schema writes its first argument in place and returns it
// (`Tensor(a!) self -> Tensor(a!)`).
bool returns_written_first(const c10::FunctionSchema* s);

// aten's dropouts (one table): `kind` is aten::dropout, feature_dropout,
// alpha_dropout or feature_alpha_dropout, in place (`_`) or not as asked.
// ATen's _dropout_impl returns its input untouched when p == 0 or not training
// (an alias no schema declares).
bool is_dropout_kind(const std::string& kind, bool inplace);
// Whether dropout node `d` (either form) provably does nothing: a constant
// p == 0 or a constant train == false.
bool dropout_is_identity(const GraphView& g, NodeRef d);

} // namespace memslim::saved

namespace memslim {

// Whether a node of `kind` changes the grad mode (or autocast) for the nodes
// after it: TorchScript's `with` (prim::Enter / prim::Exit), an FX graph's
// torch._C._set_grad_enabled and autocast enter / exit. No rewrite covering
// several nodes may reach across one (fuzzer seeds 60 and 232, 2026-11-24:
// elu under no_grad fused with its dropout outside; x * sigmoid(x) with the
// sigmoid under no_grad made silu(x)), and a region's op runs in its nodes' mode.
bool switches_grad_mode(const std::string& kind);

// Why an in-place write to `w` could be observed by someone other than the
// writer, or nullopt when it cannot: `w` has another use, is a graph input,
// or may share storage with another tensor by its producer's schema (or a
// dropout's undeclared alias). Both front ends' gates ask this before a
// rewrite removes a write.
std::optional<std::string> write_observable(const GraphView& g, ValueRef w);

} // namespace memslim
