//===- region_kernel.h - a recompute region as one fused CPU loop ----------===//
//
// What: lowers a memslim::recompute_region graph to kernels::region's program
// (the ops with a full-size operand) plus a prelude graph (the ops on 0-dim
// tensors and constants only, run with aten), and runs both: the forward in
// one pass over the inputs, the backward in one pass over inputs and output
// gradients, the prelude's gradients through autograd. Used by
// recompute_region.cpp when every full-size input is a plain contiguous fp32
// CPU tensor of one shape; everything else (other dtypes, broadcasting, CUDA,
// fake tensors, an op without a loop form) runs the interpreter as before.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memslim {

class FusedRegion;

// Whether the fused loop may be used at all (MEMSLIM_REGION_KERNEL=0: never).
bool fused_regions_enabled();

// Which inputs are full-size (the rest 0-dim), or nullopt when the inputs do
// not suit the loop.
std::optional<std::vector<bool>> fused_input_kinds(at::TensorList inputs);

// The loop for `graph` with inputs of these kinds; null (and `why`) when a node
// has no loop form.
std::shared_ptr<const FusedRegion> lower_region(torch::jit::Graph& graph,
                                                const std::vector<bool>& full, std::string* why);

// The region's outputs; nullopt when a prelude value is not a real 0-dim tensor.
std::optional<std::vector<at::Tensor>> fused_region_forward(const FusedRegion& r,
                                                            at::TensorList inputs);

// Gradients of the inputs with `wanted` set (undefined where no output with a
// defined gradient depends on them); nullopt when the loop does not apply.
std::optional<std::vector<at::Tensor>> fused_region_backward(const FusedRegion& r,
                                                             at::TensorList inputs,
                                                             at::TensorList grads,
                                                             const std::vector<bool>& wanted);

} // namespace memslim
