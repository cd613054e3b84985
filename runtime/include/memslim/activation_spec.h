//===- activation_spec.h - from a memslim op's arguments to kernel params --===//
//
// What: maps each public op (aten name and arguments) to the kernel activation
// it runs and that kernel's parameters, and picks the guard-band width per
// dtype. Why: the public ops keep aten's signatures (celu and selu are elu with
// fixed parameters, gelu's `approximate` selects the kernel), while the
// internal forward/backward ops carry one `str act, float[] params` form.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Scalar.h>

#include <optional>
#include <string>
#include <vector>

#include "memslim/kernels/act_spec.h"
#include "memslim/kernels/activations.h"

namespace memslim {

// ActSpec: memslim/kernels/act_spec.h (shared with the decision core).

kernels::Act act_from_name(const std::string& act);
const char* act_name(kernels::Act a);
// Throws unless `act` takes exactly n parameters (a missing one read as 0 gave
// zeros: elu with scale 0).
void check_param_count(const char* op, const std::string& act, size_t n);

// Kernel parameters for one call on a tensor of dtype `t`.
kernels::ActParams make_params(kernels::Act a, const std::vector<double>& params, at::ScalarType t);

// What memslim::activation_forward(save=True) returns besides the output, for
// a kernel activation name, its parameters and the largest finite value of the
// dtype (the Python fake impl passes torch.finfo(dtype).max): packed bits?
// an exact list (data-dependent length)?
bool act_keeps_bits(const std::string& act, const std::vector<double>& params);
bool act_keeps_exact_list(const std::string& act, const std::vector<double>& params,
                          double out_max);
bool act_keeps_exact_list(const std::string& act, const std::vector<double>& params,
                          at::ScalarType t);

// Guard-band half-width around a non-monotonic activation's minimum for dtype t
// (see the README's numerics table for how each was chosen).
double guard_band(kernels::Act a, at::ScalarType t);

// Rejects non-floating dtypes with a one-line error naming the op.
void check_dtype(const at::Tensor& x, const std::string& op);

ActSpec spec_gelu(c10::string_view approximate);
ActSpec spec_softplus(const c10::Scalar& beta, const c10::Scalar& threshold);
ActSpec spec_elu(const c10::Scalar& alpha, const c10::Scalar& scale,
                 const c10::Scalar& input_scale);
ActSpec spec_celu(const c10::Scalar& alpha);
ActSpec spec_selu();
ActSpec spec_leaky_relu(const c10::Scalar& negative_slope);
ActSpec spec_simple(const std::string& name); // silu, mish, hardswish, ...

// The spec public op `op` (activation_table.def) computes from its arguments
// after `self`, through the op's own spec function: nullopt for an unknown op
// or a wrong argument count; throws c10::Error on a wrong argument type or
// where the op itself would (celu with alpha = 0).
std::optional<ActSpec> spec_for(const std::string& op, const std::vector<c10::IValue>& args);

} // namespace memslim
