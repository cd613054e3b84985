//===- act_spec.h - a public op's kernel activation and parameters ---------===//
//
// What: ActSpec, what a public op's arguments mean to the kernels (which
// activation of activation_table.def, with which parameters). Torch-free: the
// runtime makes one from an op call (runtime/activation_spec.h), the decision
// core from a graph's constants (core/act_spec.h), and both hand it to the
// fused ops as their `act` / `params` arguments.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

namespace memslim {

struct ActSpec {
  std::string op;             // public op name, for messages: "gelu"
  std::string act;            // kernel activation name: "gelu_tanh"
  std::vector<double> params; // up to three kernel parameters
};

} // namespace memslim
