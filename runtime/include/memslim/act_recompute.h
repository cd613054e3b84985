//===- act_recompute.h - an activation and its backward with aten's ops ---===//
//
// What: act(h) and dL/dh from dL/d act(h), for a kernel activation name of
// activation_table.def ("gelu", "relu", "elu" for celu/selu, ...; "none" is
// the identity), computed with aten's own ops: recomputing act(h) gives the
// forward's values bit for bit.
// Why: the ops that keep an activation's input instead of its output
// (memslim::act_linear / act_conv*d, the norm + residual joins) recompute it
// in backward; one definition of which aten op each name means.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace memslim {

// act(h) with aten's op.
at::Tensor act_recompute(const at::Tensor& h, const std::string& act, at::ArrayRef<double> params);
// dL/dh from g = dL/d act(h); `a` is act(h) (read by the activations whose
// backward uses the output: sigmoid, tanh, relu).
at::Tensor act_recompute_backward(const at::Tensor& g, const at::Tensor& h, const at::Tensor& a,
                                  const std::string& act, at::ArrayRef<double> params);

} // namespace memslim
