//===- optimize.cpp - memslim::optimize over a module's methods ------------===//
#include "memslim/passes/optimize.h"

#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/shape_analysis.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <unordered_map>

namespace memslim {

using torch::jit::Graph;
using torch::jit::Module;
using torch::jit::Node;
using torch::jit::Value;

void record_shapes(const std::shared_ptr<Graph>& graph, const std::vector<c10::IValue>& inputs) {
  TORCH_CHECK(graph->inputs().size() == inputs.size(), "the graph takes ", graph->inputs().size(),
              " inputs, got ", inputs.size());
  // Recording run: a copy of the graph that also returns every tensor a
  // top-level node produces, interpreted once without grad on the inputs.
  // Node order is preserved by Graph::copy, so values pair up in order.
  std::shared_ptr<Graph> rec = graph->copy();
  std::vector<Value*> recorded;
  auto o = graph->nodes().begin();
  auto c = rec->nodes().begin();
  for (; o != graph->nodes().end() && c != rec->nodes().end(); ++o, ++c) {
    TORCH_INTERNAL_ASSERT(o->kind() == c->kind(), "graph copy changed node order");
    for (size_t i = 0; i < o->outputs().size(); ++i) {
      if (!o->output(i)->type()->cast<c10::TensorType>()) continue;
      recorded.push_back(o->output(i));
      rec->registerOutput(c->output(i));
    }
  }
  torch::jit::Stack stack(inputs.begin(), inputs.end());
  {
    at::NoGradGuard no_grad;
    torch::jit::Code code(rec, "memslim_shape_recording");
    torch::jit::InterpreterState(code).run(stack);
  }
  // Outputs: the graph's own, then the recorded ones.
  const size_t first = stack.size() - recorded.size();
  for (size_t i = 0; i < recorded.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) recorded[i]->setType(c10::TensorType::create(v.toTensor()));
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].isTensor()) graph->inputs()[i]->setType(c10::TensorType::create(inputs[i].toTensor()));
}

void propagate_shapes(const std::shared_ptr<Graph>& graph, const Module& module,
                      const std::vector<at::Tensor>& example_inputs) {
  TORCH_CHECK(graph->inputs().size() == example_inputs.size() + 1,
              "memslim.optimize: forward takes ", graph->inputs().size() - 1,
              " inputs, got ", example_inputs.size(), " example inputs");
  std::vector<c10::IValue> inputs{module._ivalue()};
  for (const auto& t : example_inputs) inputs.emplace_back(t);
  record_shapes(graph, inputs);
}

OptimizeResult optimize(const Module& module, const OptimizeOptions& options) {
  // clone(inplace=true): new class types with their own method graphs, the
  // same parameter and buffer tensors (an optimizer over the original model
  // keeps training the optimized one).
  OptimizeResult result{module.clone(/*inplace=*/true), {}};
  std::vector<const PassInfo*> plan;
  std::vector<std::string> names = options.passes;
  if (names.empty()) {
    const PipelineInfo* pl = find_pipeline(options.pipeline);
    TORCH_CHECK(pl, "memslim.optimize: unknown pipeline '", options.pipeline, "'");
    names = pl->passes;
  }
  for (const auto& n : names) {
    const PassInfo* p = find_pass(n);
    TORCH_CHECK(p, "memslim.optimize: unknown pass '", n, "'");
    plan.push_back(p);
  }
  for (const auto& method : options.methods) {
    auto m = result.module.find_method(method);
    TORCH_CHECK(m, "memslim.optimize: the module has no method '", method, "'");
    std::shared_ptr<Graph> graph = m->graph();
    torch::jit::Inline(*graph);
    // F.silu / F.gelu and friends script to `if inplace: op_(x) else: op(x)`;
    // folding the constant flag leaves the plain op at top level.
    torch::jit::ConstantPropagation(graph);
    if (method == "forward" && !options.example_inputs.empty())
      propagate_shapes(graph, result.module, options.example_inputs);
    PassContext ctx;
    ctx.policy = options.policy;
    for (const PassInfo* p : plan) p->run(graph, ctx);
    // Back to generic types: the executor profiles its own.
    torch::jit::EraseShapeInformation(graph);
    for (const auto& r : ctx.remarks.lines()) result.remarks.push_back(r);
  }
  return result;
}

} // namespace memslim
