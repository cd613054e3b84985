//===- optimize.cpp - memslim::optimize over a module's methods ------------===//
#include "memslim/passes/optimize.h"

#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/shape_analysis.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <torch/csrc/jit/runtime/graph_iterator.h>
#include <torch/library.h>

#include <cstdlib>
#include <unordered_map>

namespace memslim {

using torch::jit::Graph;
using torch::jit::Module;
using torch::jit::Node;
using torch::jit::Value;

namespace {
// The recording run's sink: memslim::_record_type writes each recorded
// tensor's complete type into slot `id`. Thread-local: one recording per thread.
thread_local std::vector<c10::TypePtr>* g_record_sink = nullptr;
} // namespace

void record_shapes(const std::shared_ptr<Graph>& graph, const std::vector<c10::IValue>& inputs) {
  TORCH_CHECK(graph->inputs().size() == inputs.size(), "the graph takes ", graph->inputs().size(),
              " inputs, got ", inputs.size());
  // Recording run: a copy of the graph in which every tensor a node produces
  // (in any block: branches and loop bodies included) is passed to
  // memslim::_record_type right after it is made; the copy is interpreted once
  // without grad. Graph::copy keeps the structure, so a depth-first walk of
  // both graphs pairs the values up. Values in branches that did not run keep
  // their generic type (and their sites are priced "unknown shape").
  std::shared_ptr<Graph> rec = graph->copy();
  std::vector<Value*> recorded;
  std::vector<std::pair<Node*, Value*>> probes;  // (node in copy, its output to record)
  {
    std::shared_ptr<Graph> g_mut = graph;
    torch::jit::DepthFirstGraphNodeIterator o(g_mut);
    torch::jit::DepthFirstGraphNodeIterator c(rec);
    for (Node *on = o.next(), *cn = c.next(); on && cn; on = o.next(), cn = c.next()) {
      TORCH_INTERNAL_ASSERT(on->kind() == cn->kind(), "graph copy changed node order");
      for (size_t i = 0; i < on->outputs().size(); ++i) {
        if (!on->output(i)->type()->cast<c10::TensorType>()) continue;
        recorded.push_back(on->output(i));
        probes.emplace_back(cn, cn->output(i));
      }
    }
  }
  const c10::Symbol record = c10::Symbol::fromQualString("memslim::_record_type");
  for (size_t id = 0; id < probes.size(); ++id) {
    auto [node, value] = probes[id];
    torch::jit::WithInsertPoint guard(node->next());
    rec->insertNode(rec->create(record, {value, rec->insertConstant(int64_t(id))}, 0));
  }
  std::vector<c10::TypePtr> sink(recorded.size());
  torch::jit::Stack stack(inputs.begin(), inputs.end());
  {
    at::NoGradGuard no_grad;
    g_record_sink = &sink;
    try {
      torch::jit::Code code(rec, "memslim_shape_recording");
      torch::jit::InterpreterState(code).run(stack);
    } catch (...) {
      g_record_sink = nullptr;
      throw;
    }
    g_record_sink = nullptr;
  }
  for (size_t i = 0; i < recorded.size(); ++i)
    if (sink[i]) recorded[i]->setType(sink[i]);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].isTensor()) graph->inputs()[i]->setType(c10::TensorType::create(inputs[i].toTensor()));
}

void propagate_shapes(const std::shared_ptr<Graph>& graph, const Module& module,
                      const std::vector<at::Tensor>& example_inputs) {
  const size_t want = graph->inputs().size() - 1;
  TORCH_CHECK(example_inputs.size() <= want, "memslim.optimize: forward takes ", want,
              " inputs, got ", example_inputs.size(), " example inputs");
  std::vector<c10::IValue> inputs{module._ivalue()};
  for (const auto& t : example_inputs) inputs.emplace_back(t);
  // Trailing optional arguments (masks and the like) not given: None.
  for (size_t i = example_inputs.size() + 1; i < graph->inputs().size(); ++i) {
    TORCH_CHECK(graph->inputs()[i]->type()->kind() == c10::TypeKind::OptionalType,
                "memslim.optimize: forward takes ", want, " inputs, got ", example_inputs.size(),
                " example inputs");
    inputs.emplace_back();
  }
  record_shapes(graph, inputs);
}

OptimizeResult optimize(const Module& module, const OptimizeOptions& options) {
  // clone(inplace=true): new class types with their own method graphs, the
  // same parameter and buffer tensors (an optimizer over the original model
  // keeps training the optimized one).
  OptimizeResult result{module.clone(/*inplace=*/true), {}};
  std::vector<const PassInfo*> plan;
  try {
    plan = resolve_plan(options.passes, options.pipeline);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "memslim.optimize: ", e.what());
  }
  for (const auto& method : options.methods) {
    auto m = result.module.find_method(method);
    TORCH_CHECK(m, "memslim.optimize: the module has no method '", method, "'");
    std::shared_ptr<Graph> graph = m->graph();
    {
      // The inliner leaves calls alone while the executor's optimisation flag
      // is off (torch._C._set_graph_executor_optimize(False)); memslim needs
      // the flat graph whatever that flag says.
      const bool was = torch::jit::getGraphExecutorOptimize();
      torch::jit::setGraphExecutorOptimize(true);
      torch::jit::Inline(*graph);
      torch::jit::setGraphExecutorOptimize(was);
    }
    // F.silu / F.gelu and friends script to `if inplace: op_(x) else: op(x)`;
    // folding the constant flag leaves the plain op at top level.
    torch::jit::ConstantPropagation(graph);
    if (method == "forward" && !options.example_inputs.empty())
      propagate_shapes(graph, result.module, options.example_inputs);
    PassContext ctx;
    ctx.policy = options.policy;
    // MEMSLIM_STRICT=1 (the test suites): a failing pass is an error, not a rollback.
    const char* strict_env = std::getenv("MEMSLIM_STRICT");
    ctx.strict = options.strict || (strict_env && std::string(strict_env) == "1");
    for (const PassInfo* p : plan) run_pass(*p, graph, ctx);
    // Back to generic types: the executor profiles its own.
    torch::jit::EraseShapeInformation(graph);
    for (const auto& r : ctx.remarks.lines()) result.remarks.push_back(r);
  }
  return result;
}

} // namespace memslim

// The recording run's probe (not a user op; see record_shapes).
TORCH_LIBRARY_FRAGMENT(memslim, m) {
  // `Any`: values typed Tensor can be Uninitialized at run time (the paths
  // TorchScript builds for early returns); those are not recorded.
  m.def("_record_type(Any t, int id) -> ()", [](const c10::IValue& t, int64_t id) {
    if (t.isTensor() && memslim::g_record_sink && id >= 0 &&
        size_t(id) < memslim::g_record_sink->size())
      (*memslim::g_record_sink)[size_t(id)] = c10::TensorType::create(t.toTensor());
  });
}
