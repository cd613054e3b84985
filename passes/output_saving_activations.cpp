//===- output_saving_activations.cpp - aten activation -> memslim op --------===//
//
// What: replaces an aten activation (gelu, silu, mish, hardswish, softplus,
// elu, celu, selu, leaky_relu, hardsigmoid, relu) by its memslim op (same
// arguments) when the cost model says autograd then keeps fewer bytes.
// Why: aten keeps the activation's input and the next Linear/Conv keeps its
// output; memslim keeps the output (shared with that consumer) plus n/8 bytes,
// or only a bit mask. Whether that frees anything depends on the graph: the
// input may be kept by another consumer, the output may be kept by nobody
// (then saving it costs memory). Decided per site from SavedTensorAnalysis.
// Safety: the rewrite goes through the SafetyGate, guarding the input and the
// output against later in-place writes: the output is what the backward reads,
// and a later write to the input means someone relies on aten's saved-input
// check. Writes before the activation (ResNet's `out += identity`) are harmless.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/runtime/graph_iterator.h>

#include <sstream>

#include "memslim/passes/activation_table.h"
#include "memslim/passes/pass.h"
#include "memslim/passes/safety_gate.h"
#include "memslim/passes/saved_tensor_analysis.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

namespace {

constexpr const char* kPass = "output-saving-activations";

// Bytes this activation makes autograd keep, beyond what others keep anyway.
int64_t kept_bytes(Keeps k, bool x_kept_elsewhere, bool y_kept_elsewhere, int64_t x_bytes,
                   int64_t y_bytes, int64_t bits) {
  switch (k) {
  case Keeps::Input: return x_kept_elsewhere ? 0 : x_bytes;
  case Keeps::Output: return y_kept_elsewhere ? 0 : y_bytes;
  case Keeps::OutputAndBits: return (y_kept_elsewhere ? 0 : y_bytes) + bits;
  case Keeps::Bits: return bits;
  }
  return 0;
}

std::string at(const Node* n) { return n->kind().toQualString() + std::string(" at %") + n->output()->debugName(); }

} // namespace

std::optional<OutputSavingPrice> output_saving_price(const Node* n, const CostPolicy& policy) {
  auto info = activation_info(n->kind());
  if (!info) return std::nullopt;
  const Value* x = n->input(0);
  const Value* y = n->output();
  OutputSavingPrice p;
  auto xb = SavedTensorAnalysis::bytes(x), yb = SavedTensorAnalysis::bytes(y);
  auto n_el = SavedTensorAnalysis::numel(y);
  if (!xb || !yb || !n_el) {
    if (policy.assume_numel <= 0) return std::nullopt;
    n_el = policy.assume_numel;
    xb = yb = 4 * policy.assume_numel;
    p.assumed = true;
  }
  const bool x_else = SavedTensorAnalysis::kept_by_other(x, n, &p.x_kept_by);
  const bool y_else = SavedTensorAnalysis::kept_by_other(y, n, &p.y_kept_by);
  const int64_t bits = (*n_el + 7) / 8;
  p.aten = kept_bytes(info->aten_keeps, x_else, y_else, *xb, *yb, bits);
  p.ours = kept_bytes(info->memslim_keeps, x_else, y_else, *xb, *yb, bits);
  return p;
}

void run_output_saving_activations(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  std::vector<Node*> sites;
  {
    std::shared_ptr<torch::jit::Graph> gm = g;
    torch::jit::DepthFirstGraphNodeIterator it(gm);  // every block: If branches too
    for (Node* n = it.next(); n; n = it.next()) {
      auto info = activation_info(n->kind());
      if (info && n->kind() == info->aten) sites.push_back(n);
    }
  }
  for (Node* n : sites) {
    if (!ctx.gate->alive(n)) continue;
    const ActivationInfo info = *activation_info(n->kind());
    Value* x = n->input(0);
    Value* y = n->output();
    if (info.aten_keeps == Keeps::Output && info.memslim_keeps == Keeps::Output) {
      ctx.remarks.kept(kPass, at(n), "aten already keeps only the output");
      continue;
    }
    if (ctx.policy.max_added_work >= 0 && info.added_work > ctx.policy.max_added_work) {
      std::ostringstream why;
      why << "adds ~" << info.added_work << " evaluations per element, above the maximum "
          << ctx.policy.max_added_work;
      ctx.remarks.kept(kPass, at(n), why.str(), {std::nullopt, std::nullopt, info.added_work});
      continue;
    }
    auto price = output_saving_price(n, ctx.policy);
    if (!price) {
      ctx.remarks.kept(kPass, at(n), "unknown shape (give input shapes)");
      continue;
    }
    const OutputSavingPrice& p = *price;
    std::ostringstream why;
    if (p.freed() < ctx.policy.min_bytes) {
      if (info.aten_keeps == Keeps::Input && !p.x_kept_by.empty())
        why << "input also saved by " << p.x_kept_by;
      else if (p.y_kept_by.empty() && info.memslim_keeps != Keeps::Bits)
        why << "output not saved by any consumer (memslim would add " << (p.ours - p.aten)
            << " B)";
      else
        why << "frees " << p.freed() << " B, below the " << ctx.policy.min_bytes << " B minimum";
      ctx.remarks.kept(kPass, at(n), why.str(), {p.aten, p.ours, info.added_work});
      continue;
    }
    why << "rewrote " << info.aten.toQualString() << " at %" << y->debugName() << ": keeps "
        << keeps_name(info.memslim_keeps) << " instead of " << keeps_name(info.aten_keeps)
        << ", frees " << p.freed() << " B (" << p.aten << " -> " << p.ours << ")"
        << (p.assumed ? " with assumed shapes" : "");
    Proposal prop;
    prop.site = at(n);
    prop.covers = {n};
    // The memslim op keeps y; aten kept x (a later write to x makes aten's
    // backward fail, which the rewrite must not silence).
    prop.guarded = {x, y};
    prop.apply = [&, n, y]() {
      replace_output(*g, n, y, info.memslim, n->inputs());
      return std::string();
    };
    prop.rewrote = why.str();
    prop.price = {p.aten, p.ours, info.added_work};
    ctx.gate->submit(prop);
  }
}

} // namespace memslim
