//===- optimize.h - ahead-of-time rewriting of a scripted module ------------===//
//
// What: memslim::optimize clones a TorchScript module (so its method graphs are
// its own, not shared with other instances of its class), inlines each method,
// gives the graph concrete shapes from example inputs (parameters' shapes come
// from the module itself), runs a pipeline, and erases the shapes again.
// Why ahead of time: the profiling executor runs custom passes only on no-grad
// graphs or after autodiff has fixed what is saved (../shared/DESIGN.md), so
// training-time rewrites must change the method graphs before the first call.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/api/module.h>

#include <string>
#include <vector>

#include "memslim/passes/pass.h"

namespace memslim {

struct OptimizeOptions {
  std::vector<std::string> methods = {"forward"};
  std::vector<std::string> passes;            // empty: the pipeline below
  std::string pipeline = "memslim-default";
  std::vector<at::Tensor> example_inputs;     // for `forward` (without self)
  CostPolicy policy;
  // A pass that throws or breaks the graph is an error (tests), not a rollback.
  bool strict = false;
};

struct OptimizeResult {
  torch::jit::Module module;
  std::vector<std::string> remarks;
};

OptimizeResult optimize(const torch::jit::Module& module, const OptimizeOptions& options);

// Gives every tensor a top-level node of `graph` produces, and every graph
// input, the complete type (sizes, strides, dtype, device) it has when forward
// runs on `example_inputs` (a recording run, no grad). torch's static shape
// analyses do not cover module graphs (parameters come from GetAttr) nor
// aten::linear, so the shapes are measured instead.
// The same for any graph and its full input list (tensors and objects).
void record_shapes(const std::shared_ptr<torch::jit::Graph>& graph,
                   const std::vector<c10::IValue>& inputs);

void propagate_shapes(const std::shared_ptr<torch::jit::Graph>& graph,
                      const torch::jit::Module& module,
                      const std::vector<at::Tensor>& example_inputs);

} // namespace memslim
