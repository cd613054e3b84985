//===- runtime_test.cpp - memslim ops from C++: dispatcher, autograd, JIT ---===//
#include <gtest/gtest.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdlib>

#include "memslim/activation_spec.h"

extern "C" int memslim_runtime_anchor();

namespace {

at::Tensor call_unary(const char* name, const at::Tensor& x) {
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow(name, "")
                .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

TEST(Runtime, LibraryIsLinked) { EXPECT_EQ(memslim_runtime_anchor(), 1); }

TEST(Runtime, SchemasAreAtenSignatures) {
  auto& d = c10::Dispatcher::singleton();
  EXPECT_EQ(c10::toString(d.findSchemaOrThrow("memslim::gelu", "").schema()),
            "memslim::gelu(Tensor self, str approximate=\"none\") -> Tensor");
  EXPECT_EQ(c10::toString(d.findSchemaOrThrow("memslim::leaky_relu", "").schema()),
            "memslim::leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor");
  for (const char* op : {"silu", "mish", "softplus", "elu", "celu", "selu", "hardswish",
                         "hardsigmoid", "sigmoid", "tanh", "relu"})
    EXPECT_TRUE(d.findSchema({std::string("memslim::") + op, ""}).has_value()) << op;
}

// spec_for (what fuse-activation-dropout calls) maps an op's argument values to
// the kernel and parameters the op itself runs, for every row of the table.
TEST(Runtime, SpecForMapsArgumentsAsTheOpDoes) {
  using memslim::spec_for;
  auto celu = spec_for("celu", {c10::IValue(0.5)});
  ASSERT_TRUE(celu.has_value());
  EXPECT_EQ(celu->act, "elu");
  EXPECT_EQ(celu->params, (std::vector<double>{0.5, 1.0, 2.0}));
  EXPECT_EQ(spec_for("gelu", {c10::IValue(std::string("tanh"))})->act, "gelu_tanh");
  EXPECT_EQ(spec_for("gelu", {c10::IValue(std::string("none"))})->act, "gelu");
  EXPECT_EQ(spec_for("softplus", {c10::IValue(2), c10::IValue(1.5)})->params,
            (std::vector<double>{2.0, 1.5}));
  EXPECT_EQ(spec_for("selu", {})->act, "elu");
  EXPECT_FALSE(spec_for("silu", {c10::IValue(1.0)}).has_value()); // silu takes none
  EXPECT_FALSE(spec_for("softplus", {c10::IValue(1.0)}).has_value());
  EXPECT_FALSE(spec_for("relu6", {}).has_value());                // not in the table
  EXPECT_THROW(spec_for("celu", {c10::IValue(0.0)}), c10::Error); // aten's own error
  EXPECT_THROW(spec_for("leaky_relu", {c10::IValue(std::string("x"))}), c10::Error);
  for (const char* op : {"silu", "mish", "hardswish", "hardsigmoid", "sigmoid", "tanh", "relu"})
    EXPECT_EQ(spec_for(op, {})->act, op);
}

TEST(Runtime, AutogradMatchesAten) {
  torch::manual_seed(0);
  auto x = torch::randn({257, 33}, torch::requires_grad());
  auto g = torch::randn({257, 33});
  struct Pair {
    const char* op;
    std::function<at::Tensor(const at::Tensor&)> aten;
  };
  std::vector<Pair> pairs = {
      {"memslim::silu", [](const at::Tensor& t) { return torch::silu(t); }},
      {"memslim::mish", [](const at::Tensor& t) { return torch::mish(t); }},
      {"memslim::hardswish", [](const at::Tensor& t) { return torch::hardswish(t); }},
      {"memslim::selu", [](const at::Tensor& t) { return torch::selu(t); }},
      {"memslim::relu", [](const at::Tensor& t) { return torch::relu(t); }},
      {"memslim::sigmoid", [](const at::Tensor& t) { return torch::sigmoid(t); }},
  };
  for (auto& p : pairs) {
    auto y1 = call_unary(p.op, x);
    auto g1 = torch::autograd::grad({y1}, {x}, {g})[0];
    auto y2 = p.aten(x);
    auto g2 = torch::autograd::grad({y2}, {x}, {g})[0];
    EXPECT_TRUE(torch::allclose(y1, y2, 1e-5, 1e-6)) << p.op;
    EXPECT_LT((g1 - g2).abs().max().item<float>(), 1e-4 * g.abs().max().item<float>()) << p.op;
  }
}

TEST(Runtime, NoGradInputBuildsNoGraph) {
  auto x = torch::randn({16});
  auto y = call_unary("memslim::silu", x);
  EXPECT_FALSE(y.requires_grad());
  torch::NoGradGuard ng;
  auto xr = torch::randn({16}, torch::requires_grad());
  EXPECT_FALSE(call_unary("memslim::mish", xr).requires_grad());
}

TEST(Runtime, IntegerInputIsAClearError) {
  try {
    call_unary("memslim::silu", torch::ones({3}, torch::kLong));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("memslim::silu: expected a floating-point tensor"),
              std::string::npos);
  }
}

TEST(Runtime, RunsInTorchScriptGraphs) {
  // TorchScript IR text (the form memslim-opt reads) calling memslim ops.
  auto graph = std::make_shared<torch::jit::Graph>();
  torch::jit::parseIR(R"IR(
graph(%x : Tensor):
  %none : str = prim::Constant[value="none"]()
  %y : Tensor = memslim::gelu(%x, %none)
  %z : Tensor = memslim::silu(%y)
  return (%z))IR",
                      graph.get());
  torch::jit::GraphExecutor exec(graph, "memslim_test");
  auto x = torch::randn({8, 8});
  torch::jit::Stack stack{x};
  exec.run(stack);
  auto ref = torch::silu(torch::gelu(x));
  EXPECT_TRUE(torch::allclose(stack.back().toTensor(), ref, 1e-5, 1e-6));
}

TEST(Runtime, GraphExecutorTrains) {
  // Training through the TorchScript executor: the memslim op stays outside
  // differentiable graphs and uses its own autograd kernel. Several calls, so
  // the profiling executor's optimized plan runs too.
  auto graph = std::make_shared<torch::jit::Graph>();
  torch::jit::parseIR(R"IR(
graph(%x : Tensor):
  %tanh : str = prim::Constant[value="tanh"]()
  %none : NoneType = prim::Constant()
  %y : Tensor = memslim::gelu(%x, %tanh)
  %s : Tensor = aten::sum(%y, %none)
  return (%s))IR",
                      graph.get());
  torch::jit::GraphExecutor exec(graph, "memslim_train");
  for (int call = 0; call < 3; ++call) {
    auto x = torch::randn({64}, torch::requires_grad());
    torch::jit::Stack stack{x};
    exec.run(stack);
    stack.back().toTensor().backward();
    auto x2 = x.detach().clone().requires_grad_(true);
    torch::gelu(x2, "tanh").sum().backward();
    EXPECT_LT((x.grad() - x2.grad()).abs().max().item<float>(), 1e-4) << "call " << call;
  }
}

// memslim::recompute_region from C++: same values and gradients as the aten ops
// it runs (the trainable 0-dim exponent included); saved bytes: test_recompute_regions.py.
TEST(Runtime, RecomputeRegionMatchesAtenAndSavesItsInputs) {
  const std::string ir = R"IR(graph(%x : Tensor, %a : Tensor):
  %one : int = prim::Constant[value=1]()
  %p : Tensor = aten::pow(%x, %a)
  %e : Tensor = aten::exp(%p)
  %s : Tensor = aten::mul(%e, %x)
  return (%s))IR";
  using Op = std::vector<at::Tensor>(at::TensorList, c10::string_view);
  auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("memslim::recompute_region", "").typed<Op>();
  torch::manual_seed(0);
  auto x = (torch::rand({1000}) + 0.5).requires_grad_();
  auto a = torch::tensor(1.3).requires_grad_();
  auto g = torch::randn({1000});
  auto ref = torch::exp(torch::pow(x, a)) * x;
  ref.backward(g);
  auto ref_gx = x.grad().clone(), ref_ga = a.grad().clone();
  // The interpreter (MEMSLIM_REGION_KERNEL=0) runs aten's ops: bit for bit; the fused
  // CPU loop (the default here) rounds differently in the last bits.
  for (bool loop : {false, true}) {
    setenv("MEMSLIM_REGION_KERNEL", loop ? "1" : "0", 1);
    x.mutable_grad().reset();
    a.mutable_grad().reset();
    auto y = op.call({x, a}, ir)[0];
    ASSERT_TRUE(y.grad_fn());
    y.backward(g);
    const double rtol = loop ? 1e-5 : 0;
    EXPECT_TRUE(torch::allclose(y, ref, rtol, 0)) << "loop " << loop;
    EXPECT_TRUE(torch::allclose(x.grad(), ref_gx, rtol, 0)) << "loop " << loop;
    EXPECT_TRUE(torch::allclose(a.grad(), ref_ga, loop ? 1e-5 : 1e-6, 0)) << "loop " << loop;
    if (!loop) EXPECT_TRUE(torch::equal(y, ref));
  }
  unsetenv("MEMSLIM_REGION_KERNEL");
  // A bad graph string is one clear error.
  try {
    op.call({x}, "graph(%x : Tensor):\n  return (%nope)");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot parse its graph argument"), std::string::npos);
  }
}

} // namespace
