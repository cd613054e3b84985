//===- rotate_half.h - RoPE's rotate_half as one op ------------------------===//
//
// What: finds `cat([neg(x[.., s:]), x[.., :s]], d)` (transformers' rotate_half,
// `torch.cat((-x2, x1), dim=-1)` with s = x.shape[-1] // 2, in every RoPE model:
// Llama, Mistral, Qwen, Gemma, GPT-NeoX) and makes it memslim::rotate_half(x,
// d, s), whose backward keeps nothing but two integers.
// Why: TorchScript's profiling executor differentiates `q * cos +
// rotate_half(q) * sin` as one DifferentiableGraph whose input is the cat's
// tensor list, and its backward keeps that list: a slice of q (so q's whole
// storage) and neg's output, per q and k per layer (measured on the suite's
// llama_small: 35,490,816 B kept from the executor's second call on, against
// 30,747,648 B on its first and in eager, where CatBackward keeps sizes only).
// Autodiff does not take unknown ops into its graphs, so the op stays out.
// Exact for every shape: the op is the same slices, neg and cat (s is the
// graph's own value, clamped as slice clamps it).
// Cost: frees neg's output and x's storage where nothing else keeps x (what
// the executor's graph keeps); adds no work (four ops become one).
// Only the TorchScript front end runs it: eager's and Inductor's cat keep
// sizes only.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"
#include "memslim/core/pass_table.h"

namespace memslim {

inline constexpr const char* kRotateHalfPass = "fuse-rotate-half";

// Whether `n` is an aten::cat of a two-element prim::ListConstruct whose first
// element is an aten::neg (the rest of the form is the decision's).
bool is_rotate_half_site(const GraphView& g, NodeRef n);
// The rewrite of cat `n` into memslim::rotate_half(x, dim, split), or a Kept
// record saying which part of the form is missing.
FormulaDecision decide_rotate_half(const GraphView& g, NodeRef n, const CostPolicy& policy);

} // namespace memslim
