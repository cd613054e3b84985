//===- verify.h - --verify: rewritten graph against the input ---*- C++ -*-===//
//
// What: runs a graph with autograd on example inputs (outputs and gradients),
// and the differential check of --verify: input graph and rewritten graph on
// the same inputs, compared tensor by tensor. Why: a rewrite must not change
// what training computes; this is the tool's own check of that.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/ir/ir.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "inputs.h"

namespace memslim_opt {

struct RunResult {
  std::vector<c10::IValue> outputs; // flattened; tensors detached
  std::vector<at::Tensor> grads;    // one per leaf (undefined: no gradient)
};

// Runs `graph` on `prefix` + `ex` with autograd (the RNG seeded the same way
// for every call), returning the flattened outputs and
// d(sum_i <w_i, out_i>)/d(inputs that require grad, params).
RunResult run_with_grads(const std::shared_ptr<torch::jit::Graph>& graph,
                         const std::vector<c10::IValue>& prefix, const Example& ex,
                         const std::vector<at::Tensor>& params);

// A copy of `g` without aten::warn nodes: torch's interpreter reads a warning's
// stack wrongly when the node has no source file (a graph parsed from text:
// "isString() INTERNAL ASSERT FAILED ... Expected String but got Int"), and
// warnings do not change what --verify compares.
std::shared_ptr<torch::jit::Graph> without_warnings(const std::shared_ptr<torch::jit::Graph>& g);

// The input graph (rewritten = false) or the rewritten one run in float64: the
// reference that tells how far the input graph's own rounding goes, and whether
// the two graphs are the same function (see verify). nullopt when it does not
// run so.
using Reference = std::function<std::optional<RunResult>(bool rewritten)>;

// Runs before and after on the same inputs; one error line when they differ
// or when either run throws, else `memslim-opt: verify: ok: ...` on stderr.
// `reset` puts module state back between runs. See verify.cpp for the bar.
void verify(const std::shared_ptr<torch::jit::Graph>& before,
            const std::shared_ptr<torch::jit::Graph>& after, const std::vector<c10::IValue>& prefix,
            const Example& ex, const std::vector<at::Tensor>& params,
            const std::function<void()>& reset = {}, const Reference& reference = {});

} // namespace memslim_opt
