//===- recompute_region.cpp - a pointwise region that keeps only its inputs -===//
//
// What: memslim::recompute_region(Tensor[] inputs, str graph) runs a straight-
// line TorchScript graph of elementwise ops (the region recompute-pointwise-
// regions cut out of a model) and, under autograd, saves only the region's
// inputs. Backward re-runs the region with grad on detached copies of those
// inputs and differentiates it with torch::autograd::grad, so gradients reach
// every input that requires grad (a trainable 0-dim order included) through
// aten's own derivative formulas: the numbers are eager PyTorch's.
// Why a `str` graph: parseIR cannot read Subgraph attributes, while a string
// argument prints, survives torch.jit.save / load and memslim-opt round trips.
// The string is parsed and compiled to interpreter Code once per process and
// cached. Forward builds no autograd graph (it runs below autograd); the price
// is one extra forward of the region in backward (README, "recompute regions").
//
//===----------------------------------------------------------------------===//
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/library.h>

#include <map>
#include <mutex>
#include <unordered_map>

#include "memslim/region_kernel.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Region {
  std::shared_ptr<torch::jit::Graph> graph;
  std::unique_ptr<torch::jit::Code> code;
  // The fused CPU loop per input kinds (which inputs are full-size); null
  // where the region has no loop form.
  mutable std::mutex mu;
  mutable std::map<std::vector<bool>, std::shared_ptr<const FusedRegion>> fused;
};

// The fused loop for these inputs (region_kernel.h), or null: the interpreter.
std::shared_ptr<const FusedRegion> fused_for(const Region& r, at::TensorList inputs) {
  if (!fused_regions_enabled()) return nullptr;
  auto kinds = fused_input_kinds(inputs);
  if (!kinds) return nullptr;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.fused.find(*kinds);
  if (it == r.fused.end())
    it = r.fused.emplace(*kinds, lower_region(*r.graph, *kinds, nullptr)).first;
  return it->second;
}

// Parses and compiles `ir` once; later calls with the same string share it.
std::shared_ptr<const Region> region_for(const std::string& ir) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<const Region>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(ir);
  if (it != cache.end()) return it->second;
  auto r = std::make_shared<Region>();
  r->graph = std::make_shared<torch::jit::Graph>();
  try {
    torch::jit::parseIR(ir, r->graph.get());
  } catch (const std::exception& e) {
    std::string msg = e.what();
    TORCH_CHECK(false, "memslim::recompute_region: cannot parse its graph argument: ",
                msg.substr(0, msg.find('\n')));
  }
  for (const torch::jit::Value* v : r->graph->inputs())
    TORCH_CHECK(v->type()->cast<c10::TensorType>(), "memslim::recompute_region: graph input %",
                v->debugName(), " is not a Tensor");
  for (const torch::jit::Value* v : r->graph->outputs())
    TORCH_CHECK(v->type()->cast<c10::TensorType>(), "memslim::recompute_region: graph output %",
                v->debugName(), " is not a Tensor");
  r->code = std::make_unique<torch::jit::Code>(r->graph, "memslim_recompute_region");
  cache.emplace(ir, r);
  return r;
}

std::vector<at::Tensor> run_region(const Region& r, at::TensorList inputs) {
  TORCH_CHECK(inputs.size() == r.graph->inputs().size(), "memslim::recompute_region: got ",
              inputs.size(), " inputs, its graph takes ", r.graph->inputs().size());
  if (auto f = fused_for(r, inputs))
    if (auto outs = fused_region_forward(*f, inputs)) return std::move(*outs);
  torch::jit::Stack stack(inputs.begin(), inputs.end());
  torch::jit::InterpreterState(*r.code).run(stack);
  std::vector<at::Tensor> outs;
  outs.reserve(stack.size());
  for (auto& v : stack) outs.push_back(std::move(v).toTensor());
  return outs;
}

struct RecomputeRegionFunction : public torch::autograd::Function<RecomputeRegionFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, const std::string& ir) {
    auto region = region_for(ir);
    std::vector<at::Tensor> outs;
    {
      at::AutoDispatchBelowADInplaceOrView guard; // no autograd graph for the region
      outs = run_region(*region, inputs);
    }
    ctx->save_for_backward(inputs.vec()); // the only tensors kept: the region's inputs
    ctx->saved_data["graph"] = ir;
    // An output nobody differentiates keeps an undefined gradient (not zeros):
    // differentiating it anyway gave its inputs a zero gradient, which sent
    // backward into their history where eager's never goes (long-fuzz seed
    // 144972: a dead where() of rsqrt's output, which addcmul_ had written, in
    // one region with a live tanh: "modified by an inplace operation").
    ctx->set_materialize_grads(false);
    std::vector<at::Tensor> non_diff;
    for (const auto& o : outs)
      if (!at::isFloatingType(o.scalar_type()) && !at::isComplexType(o.scalar_type()))
        non_diff.push_back(o);
    if (!non_diff.empty()) ctx->mark_non_differentiable(non_diff);
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "memslim::recompute_region: double backward is not supported (the region is "
                "differentiated on detached inputs); keep such code out of the optimized model");
    auto saved = ctx->get_saved_variables();
    auto region = region_for(ctx->saved_data["graph"].toStringRef());
    variable_list result(saved.size() + 1); // + the graph string
    std::vector<at::Tensor> leaves, wrt;
    std::vector<size_t> wrt_index;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor leaf = saved[i].detach();
      if (ctx->needs_input_grad(i)) {
        leaf.requires_grad_(true);
        wrt.push_back(leaf);
        wrt_index.push_back(i);
      }
      leaves.push_back(leaf);
    }
    if (wrt.empty()) return result;
    if (auto f = fused_for(*region, saved)) {
      std::vector<bool> wanted(saved.size());
      for (size_t i = 0; i < saved.size(); ++i) wanted[i] = ctx->needs_input_grad(i);
      if (auto g = fused_region_backward(*f, saved, grads, wanted)) {
        for (size_t i = 0; i < saved.size(); ++i) result[i] = (*g)[i];
        return result;
      }
    }
    std::vector<at::Tensor> outs, out_grads;
    {
      at::AutoGradMode grad(true);
      std::vector<at::Tensor> recomputed = run_region(*region, leaves);
      for (size_t i = 0; i < recomputed.size() && i < grads.size(); ++i) {
        if (!grads[i].defined() || !recomputed[i].requires_grad()) continue;
        outs.push_back(recomputed[i]);
        out_grads.push_back(grads[i]);
      }
    }
    if (outs.empty()) return result;
    variable_list g = torch::autograd::grad(outs, wrt, out_grads, /*retain_graph=*/false,
                                            /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < wrt.size(); ++k) result[wrt_index[k]] = g[k];
    return result;
  }
};

std::vector<at::Tensor> recompute_region_plain(at::TensorList inputs, c10::string_view ir) {
  return run_region(*region_for(std::string(ir)), inputs);
}

std::vector<at::Tensor> recompute_region_autograd(at::TensorList inputs, c10::string_view ir) {
  bool any_grad = false;
  for (const auto& t : inputs) any_grad = any_grad || t.requires_grad();
  if (at::GradMode::is_enabled() && any_grad)
    return RecomputeRegionFunction::apply(inputs, std::string(ir));
  at::AutoDispatchBelowADInplaceOrView guard;
  return recompute_region_plain(inputs, ir);
}

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) {
  m.impl("recompute_region", TORCH_FN(recompute_region_autograd));
}

// Every backend (CPU, CUDA, Meta): the graph's own aten ops do the work.
TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("recompute_region", TORCH_FN(recompute_region_plain));
}

} // namespace memslim
