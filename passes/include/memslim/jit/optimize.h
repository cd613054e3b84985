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
#include <unordered_map>
#include <vector>

#include "memslim/jit/pass.h"

namespace memslim {

struct OptimizeOptions {
  std::vector<std::string> methods = {"forward"};
  std::vector<std::string> passes; // empty: the pipeline below
  std::string pipeline = "memslim-default";
  // For `forward` (without self): positional values (tensors, bools, ints,
  // floats, None, strings, tuples/lists/dicts of them: what TorchScript takes),
  // then keyword values; arguments with defaults need none, trailing Optional
  // arguments without one are None.
  std::vector<c10::IValue> example_inputs;
  std::unordered_map<std::string, c10::IValue> example_kwargs;
  CostPolicy policy;
  // A pass that throws or breaks the graph is an error (tests), not a rollback.
  bool strict = false;
};

struct OptimizeResult {
  torch::jit::Module module;
  std::vector<Decision> decisions; // every method's, in order
};

OptimizeResult optimize(const torch::jit::Module& module, const OptimizeOptions& options);

// Gives every tensor a top-level node of `graph` produces, and every graph
// input, the complete type (sizes, strides, dtype, device) it has when forward
// runs on `example_inputs` (a recording run, no grad). torch's static shape
// analyses do not cover module graphs (parameters come from GetAttr) nor
// aten::linear, so the shapes are measured instead.
// The same for any graph and its full input list (tensors and objects).
// The recording run leaves side-effect nodes without outputs out (prim::Print,
// aten::warn, aten::save: it is not the user's call) and puts the global RNG
// state back afterwards (dropout in it draws numbers).
void record_shapes(const std::shared_ptr<torch::jit::Graph>& graph,
                   const std::vector<c10::IValue>& inputs);

// record_shapes for a module's `forward` graph: `example_inputs` / `kwargs`
// are checked against forward's schema (defaults filled in, trailing Optional
// arguments without a default are None); the module's state is put back
// afterwards (see ModuleStateGuard).
void propagate_shapes(const std::shared_ptr<torch::jit::Graph>& graph,
                      const torch::jit::Module& module,
                      const std::vector<c10::IValue>& example_inputs,
                      const std::unordered_map<std::string, c10::IValue>& kwargs = {});

// Throws c10::Error with one line when a policy value is out of range (the
// rules memslim-opt's flags follow): min_bytes >= 0; max_added_work >= 0 or -1
// (no bound), not NaN; 0 <= assume_numel <= 2^40; dropout_mask_bytes -1, 0 or 1.
void check_policy(const CostPolicy& policy);

// Saves a module tree's state on construction and puts it back by restore()
// and on destruction: every attribute slot (prim::SetAttr replaces them) and
// the contents of every tensor attribute that is not a parameter (BatchNorm's
// running statistics and num_batches_tracked are updated in place). Running
// forward for shapes or for a check must not change the user's module.
class ModuleStateGuard {
 public:
  explicit ModuleStateGuard(const torch::jit::Module& module);
  ~ModuleStateGuard();
  ModuleStateGuard(const ModuleStateGuard&) = delete;
  ModuleStateGuard& operator=(const ModuleStateGuard&) = delete;
  void restore();

 private:
  struct Slot {
    c10::intrusive_ptr<c10::ivalue::Object> object;
    size_t index;
    c10::IValue value;
    at::Tensor contents; // a copy of a non-parameter tensor's data
  };
  std::vector<Slot> slots_;
};

} // namespace memslim
