//===- gated_mlp.h - linear(act(g) * u) keeping g and u --------------------===//
//
// What: whether a gated MLP's down projection, aten::linear(act(g) * u, W, b)
// with act an activation of activation_table.def (silu: SwiGLU; gelu: GeGLU;
// any row), should become memslim::gated_linear(g, u, W, b, act, params)
// (runtime/gated_ops.cpp), which keeps g and u and recomputes act(g) * u in
// backward (two pointwise passes). A formula pass (core/pass_table.h
// FormulaRule): the linear becomes the op; the activation and the mul go.
// Priced from what autograd keeps: aten keeps g or act(g) in the activation,
// act(g) and u in the mul, the product in the linear; the op keeps g and u
// (what another node keeps anyway counted once; u may be g itself). The GLU
// form, g and u two views of one projection (`gate_up_proj(x).chunk(2, -1)`,
// torch.split, slices of the last dim), is the same site: the op keeps the
// two views, i.e. the projection's one storage, which aten's mul keeps too
// (priced once on both sides); every record names the form.
// Why here: both front ends decide with this function.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/core/pass_table.h"

namespace memslim {

inline constexpr const char* kGatedMlpPass = "fuse-gated-mlp";

// Whether `n` is aten::linear whose input is an aten::mul's output.
bool is_gated_mlp_site(const GraphView& g, NodeRef n);
FormulaDecision decide_gated_mlp(const GraphView& g, NodeRef n, const CostPolicy& policy);

} // namespace memslim
