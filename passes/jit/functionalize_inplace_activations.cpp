//===- functionalize_inplace_activations.cpp - act_(x) -> act(x) ------------===//
//
// What: the TorchScript front end of the functionalize decision
// (core/functionalize.cpp, shared with the FX front end): replaces an in-place
// aten activation (`aten::silu_`, `hardswish_`, `relu_`, `gelu_`, ...: the ones
// output-saving knows) by its functional form when nothing else can observe the write: its input is
// a fresh tensor (made by an op whose schema returns no alias: not a graph input, module state or a
// view) that has no other use — the SafetyGate proves that — and when the
// in-place form keeps what the functional form keeps (relu_, leaky_relu_,
// elu_, sigmoid_ ... keep their output, the functional leaky_relu/elu its
// input: functionalizing those would make the model keep more).
// Why: torchvision builds EfficientNet's SiLU and MobileNetV3's Hardswish with
// inplace=True. Eager autograd keeps the activation's input either way (the
// in-place backward needs the original value), but the rewriting passes only
// match functional ops: measured on EfficientNet-B0 at 32x3x64x64, torch.compile
// avoided 88.6 MB of exactly these inputs that memslim kept.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/runtime/autodiff.h>

#include <algorithm>

#include "memslim/core/functionalize.h"
#include "memslim/core/site_loop.h"
#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

namespace {

// The functional op's output and every value the executor may compute from it
// in the same DifferentiableGraph (chains of nodes its autodiff differentiates,
// in this block). Such a graph keeps what its backward formulas read, outputs
// included, so a later in-place write to any of them fails backward where the
// in-place activation (never in a DifferentiableGraph) trained: `sigmoid_(h)
// -> leaky_relu -> relu_` (long-fuzz seed 100315).
std::vector<Value*> autodiff_reach(Value* out) {
  std::vector<Value*> seen{out}, work{out};
  while (!work.empty()) {
    Value* v = work.back();
    work.pop_back();
    for (const auto& use : v->uses()) {
      Node* u = use.user;
      if (u->owningBlock() != out->node()->owningBlock() || !torch::jit::isDifferentiable(u))
        continue;
      for (Value* o : u->outputs())
        if (std::find(seen.begin(), seen.end(), o) == seen.end()) {
          seen.push_back(o);
          work.push_back(o);
        }
    }
  }
  return seen;
}

} // namespace

void run_functionalize_inplace_activations(const std::shared_ptr<torch::jit::Graph>& g,
                                           PassContext& ctx) {
  const JitGraphView view(g);
  auto rewrite = [&](NodeRef site, FunctionalizeDecision& dec) {
    FunctionalizeDecision* d = &dec;
    Node* n = JitGraphView::node(site);
    const c10::Symbol f = c10::Symbol::fromQualString(d->functional);
    Proposal prop;
    prop.site = d->decision.site;
    prop.covers = {n};
    // The functional op's output and what autodiff may compute from it: its
    // input has no reader but this node (the gate checks), and TorchScript's
    // executor differentiates some functional activations (hardswish,
    // softplus, leaky_relu) in DifferentiableGraphs that keep their output, so
    // a later in-place write to it (MobileNetV3's hardswish_ -> dropout_), or
    // to what such a graph computes from it, would fail backward where the
    // in-place form trains.
    // What TorchScript's executor may keep once the functional op joins a
    // DifferentiableGraph (its output, what such a graph computes from it) is the
    // gate's executor-chain rule; guarded here: the output itself.
    prop.guarded = {JitGraphView::value(d->guarded)};
    const std::vector<Value*> reach = autodiff_reach(n->output());
    // TorchScript's executor fails backward from its second call when a
    // DifferentiableGraph ends in aten::chunk with an unused piece (the piece's
    // gradient comes back at the whole tensor's size; no memslim involved:
    // `chunk(sigmoid(h), 2)[0]`). The in-place form keeps the chunk out of such
    // a graph; the functional op would bring it in (long-fuzz seed 116512).
    const Value* chunked = nullptr;
    for (const Value* v : reach)
      for (const auto& use : v->uses())
        if (use.user->kind() == c10::aten::chunk) chunked = v;
    if (chunked) {
      ctx.remarks.kept(kFunctionalizePass, prop.site,
                       "%" + chunked->debugName() +
                           " feeds aten::chunk, whose backward TorchScript's executor gets "
                           "wrong inside a DifferentiableGraph");
      return true;
    }
    prop.removes_writes = true;
    prop.makes = {{f, n->input(0)}};
    prop.apply = [&g, n, f]() {
      replace_output(*g, n, n->output(), f, n->inputs());
      return std::string();
    };
    prop.rewrote = d->decision.text;
    ctx.gate->submit(prop);
    return true;
  };
  for_each_site(
      view, [](const GraphView&, NodeRef) { return true; }, // decide_functionalize picks
      [](const GraphView& v, NodeRef n) { return decide_functionalize(v, n); }, ctx.alive(),
      rewrite, ctx.record());
}

} // namespace memslim
