//===- act_recompute.h - an activation and its backward with aten's ops ---===//
//
// What: act(h) and dL/dh from dL/d act(h), for a kernel activation name of
// activation_table.def ("gelu", "relu", "elu" for celu/selu, ...; "none" is
// the identity), computed with aten's own ops: recomputing act(h) gives the
// forward's values bit for bit; act_with_derivative, where a backward needs
// act'(h) too, one fused pass (aten's values to rounding).
// Why: the ops that keep an activation's input instead of its output
// (memslim::act_linear / act_conv*d, the norm + residual joins) recompute it
// in backward; one definition of which aten op each name means.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>

namespace memslim {

// act(h) with aten's op.
at::Tensor act_recompute(const at::Tensor& h, const std::string& act, at::ArrayRef<double> params);
// dL/dh from g = dL/d act(h); `a` is act(h) (read by the activations whose
// backward uses the output: sigmoid, tanh, relu).
at::Tensor act_recompute_backward(const at::Tensor& g, const at::Tensor& h, const at::Tensor& a,
                                  const std::string& act, at::ArrayRef<double> params);

// act(h) and act'(h) in one pass of the kernels library, where there is one
// and it is faster than aten's: gelu (erf form) on a dense fp32 CPU tensor with
// real data, on a vector build of the loops; else {}. For backward recomputes
// that need both (then dL/dh = g * act'(h)): one pass instead of aten's gelu and
// gelu_backward, aten's formulas and erf form with libmvec's exp, so the values
// are aten's to rounding, not bit for bit.
std::optional<std::pair<at::Tensor, at::Tensor>> act_with_derivative(const at::Tensor& h,
                                                                     const std::string& act);

} // namespace memslim
