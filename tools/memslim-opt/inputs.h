//===- inputs.h - example inputs: recording run and --verify -----*- C++ -*-===//
//
// What: the inputs a graph is run on (Example), made from --input-shapes
// tokens read against the graph's declared input types, or from complete
// tensor types in an IR signature. Why: the cost model needs measured shapes
// (a recording run) and --verify needs values; both come from here, seeded.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memslim_opt {

// The inputs to run a graph on, and which tensors of them require grad in --verify.
struct Example {
  std::vector<c10::IValue> values;
  std::vector<bool> requires_grad; // per value
};

// "%name : Type" of a graph input, for errors.
std::string describe(const torch::jit::Value* v);

// Reads --input-shapes tokens against the declared types of the inputs
// (`names` quoted in errors); fails with one line on a mismatch.
Example inputs_from_specs(const std::vector<c10::TypePtr>& types,
                          const std::vector<std::string>& names,
                          const std::vector<std::string>& specs);

// Complete tensor types in the signature as example inputs; nullopt (and why)
// when some input has none.
std::optional<Example> inputs_from_types(const std::shared_ptr<torch::jit::Graph>& g,
                                         std::string& why);

// The example in float64 (floating tensors converted; the rest as is).
Example in_double(const Example& ex);

} // namespace memslim_opt
