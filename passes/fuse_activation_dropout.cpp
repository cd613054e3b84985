//===- fuse_activation_dropout.cpp - dropout(act(x)) -> one memslim op ------===//
//
// What: aten::dropout(act(x), p, train) with act in gelu, silu, mish,
// hardswish, softplus, elu, celu, selu, sigmoid, tanh (and act's output used
// by nothing else) becomes memslim::activation_dropout(x, act, params, p,
// train, instance), which keeps its output plus 2 bits per element (dropout mask and the
// activation's branch) instead of the activation's input and dropout's float
// noise.
// Why: nn.TransformerEncoderLayer puts dropout between GELU and linear2, so
// output-saving GELU alone frees nothing there: dropout keeps its noise, and
// linear2 keeps dropout's output, not GELU's.
// Cost: aten keeps x (unless another consumer does) + dropout's noise (float,
// in eager autograd) or mask (bool, under TorchScript's optimising executor:
// CostPolicy::dropout_mask_bytes); memslim keeps the output (unless its
// consumer does) + n/4 bytes.
// Runs before output-saving-activations, which would otherwise take the GELU.
// Safety: through the SafetyGate (no later in-place write to x, the
// activation's output or dropout's output; nothing written between the two).
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/graph_iterator.h>

#include <sstream>

#include "memslim/activation_spec.h"
#include "memslim/passes/activation_table.h"
#include "memslim/passes/pass.h"
#include "memslim/passes/safety_gate.h"
#include "memslim/passes/saved_tensor_analysis.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

namespace {

constexpr const char* kPass = "fuse-activation-dropout";

// The kernel activation and parameters of an aten activation node when its
// arguments are constants (activation_dropout takes them as constants): the
// runtime's own spec functions, so celu/selu/gelu map exactly as the ops do.
std::optional<ActSpec> kernel_act(Node* n) {
  const std::string k = n->kind().toUnqualString();
  auto consts = [&](size_t from) {
    std::vector<c10::IValue> v;
    for (size_t i = from; i < n->inputs().size(); ++i) {
      auto iv = torch::jit::toIValue(n->input(i));
      if (!iv) return std::optional<std::vector<c10::IValue>>();
      v.push_back(*iv);
    }
    return std::optional<std::vector<c10::IValue>>(v);
  };
  auto c = consts(1);
  if (!c) return std::nullopt;
  try {
    return spec_for(k, *c);
  } catch (const c10::Error&) {
    return std::nullopt;  // e.g. celu(alpha=0): left to aten's own error
  }
}

std::string at(const Node* n) {
  return n->kind().toQualString() + std::string(" at %") + n->output()->debugName();
}

const c10::Symbol kFused = c10::Symbol::fromQualString("memslim::activation_dropout");

// One more than the largest `instance` of the graph's fused ops (a graph this
// pass already ran on keeps its numbers): every fused op of a graph gets its own, so TorchScript's CSE (which does not know the op
// draws random numbers) never sees two equal nodes (see runtime/schema.cpp).
int64_t next_instance(torch::jit::Graph& g) {
  int64_t next = 1;
  std::shared_ptr<torch::jit::Graph> shared = g.shared_from_this();
  torch::jit::DepthFirstGraphNodeIterator it(shared);
  for (Node* n = it.next(); n; n = it.next())
    if (n->kind() == kFused && n->inputs().size() > 5)
      if (auto v = torch::jit::constant_as<int64_t>(n->input(5))) next = std::max(next, *v + 1);
  return next;
}

} // namespace

void run_fuse_activation_dropout(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const c10::Symbol dropout = c10::Symbol::fromQualString("aten::dropout");
  int64_t instance = next_instance(*g);  // one scan; each applied fusion takes the next
  std::vector<Node*> sites;
  {
    std::shared_ptr<torch::jit::Graph> gm = g;
    torch::jit::DepthFirstGraphNodeIterator it(gm);
    for (Node* n = it.next(); n; n = it.next()) {
      if (n->kind() != dropout) continue;
      Node* a = n->input(0)->node();
      auto info = activation_info(a->kind());
      // Not the mask-only kernels: memslim::activation_dropout refuses them
      // (they keep no output to fuse with).
      if (info && a->kind() == info->aten && info->memslim_keeps != Keeps::Bits) sites.push_back(n);
    }
  }
  if (sites.empty()) return;
  for (Node* d : sites) {
    if (!ctx.gate->alive(d)) continue;
    Node* a = d->input(0)->node();
    Value* x = a->input(0);
    Value* out = d->output();
    if (a->output()->uses().size() != 1) {
      ctx.remarks.kept(kPass, at(a) + " + aten::dropout", "the activation's output has other uses");
      continue;
    }
    auto kact = kernel_act(a);
    if (!kact) {
      ctx.remarks.kept(kPass, at(a) + " + aten::dropout", "non-constant activation arguments");
      continue;
    }
    const auto xb = SavedTensorAnalysis::bytes(x), ob = SavedTensorAnalysis::bytes(out);
    const auto n_el = SavedTensorAnalysis::numel(out);
    if (!xb || !ob || !n_el) {
      ctx.remarks.kept(kPass, at(a) + " + aten::dropout", "unknown shape (give input shapes)");
      continue;
    }
    std::string x_by;
    const bool x_else = SavedTensorAnalysis::kept_by_other(x, a, &x_by);
    const bool out_else = SavedTensorAnalysis::kept_by_other(out, d);
    const CostPolicy policy = resolved(ctx.policy);
    const int64_t noise = policy.dropout_mask_bytes > 0 ? *n_el * policy.dropout_mask_bytes : *ob;
    const int64_t aten_keeps = (x_else ? 0 : *xb) + noise;  // input + dropout's noise or mask
    const int64_t ours = (out_else ? 0 : *ob) + 2 * ((*n_el + 7) / 8);
    const int64_t freed = aten_keeps - ours;
    const Price price{aten_keeps, ours, activation_info(a->kind())->added_work};
    if (freed < ctx.policy.min_bytes) {
      ctx.remarks.kept(kPass, at(a) + " + aten::dropout", "frees " + std::to_string(freed) + " B",
                       price);
      continue;
    }
    std::ostringstream why;
    why << "rewrote " << a->kind().toQualString() << " + aten::dropout at %" << out->debugName()
        << ": keeps output + 2 bits instead of " << (x_else ? "" : "input + ")
        << (policy.dropout_mask_bytes > 0 ? "dropout mask" : "dropout noise") << ", frees "
        << freed << " B (" << aten_keeps << " -> " << ours << ")";
    Proposal prop;
    prop.site = at(a) + " + aten::dropout";
    prop.covers = {a, d};
    prop.guarded = {x, a->output(), out};  // aten kept x; the fused op keeps out
    const ActSpec spec = *kact;
    prop.apply = [&g, &instance, d, x, out, spec]() {
      Value *act_name, *params, *id;
      {
        torch::jit::WithInsertPoint guard(d);
        act_name = g->insertConstant(spec.act);
        params = g->insertConstant(c10::IValue(spec.params));
        id = g->insertConstant(instance++);
      }
      replace_output(*g, d, out, kFused, {x, act_name, params, d->input(1), d->input(2), id});
      return std::string();
    };
    prop.rewrote = why.str();
    prop.price = price;
    ctx.gate->submit(prop);
  }
}

} // namespace memslim
