//===- invertible_couplings.cpp - coupling chains -> memslim::coupling_chain ===//
//
// What: the TorchScript front end of invertible-couplings: each chain of
// additive / affine couplings the core finds (core/couplings.h) becomes one
// memslim::coupling_chain op, with each F and G cut out of the graph as its
// own IR text (nested blocks, such as BatchNorm's checks, included; constants
// copied in; bool / int / float values read from outside passed as 0-dim
// tensors and unboxed inside), so autograd keeps the chain's two outputs
// instead of every block's intermediates.
// Safety: through the SafetyGate, covering every node of every block and
// link, guarding the chain's inputs, outputs and every tensor a function reads.
//
//===----------------------------------------------------------------------===//
#include <unordered_map>
#include <unordered_set>

#include "memslim/core/couplings.h"
#include "memslim/jit/graph_text.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

namespace {

// Cuts the chain's functions out and submits the rewrite to the gate.
void submit_chain(const std::shared_ptr<Graph>& g, CouplingChain& c, PassContext& ctx) {
  // Cut every function out first: a function the op cannot carry keeps the chain.
  std::vector<std::string> texts;
  std::vector<int64_t> arity, combine;
  std::vector<Value*> state;
  std::string why;
  bool affine = false;
  for (const Coupling& b : c.blocks) {
    combine.push_back(int64_t(b.combine1));
    combine.push_back(int64_t(b.combine2));
    affine = affine || b.combine1 != Combine::Add || b.combine2 != Combine::Add;
    for (const CouplingFn* f : {&b.F, &b.G}) {
      std::string text;
      if (why.empty()) why = cut_function_text(*f, text);
      if (!why.empty()) break;
      texts.push_back(std::move(text));
      arity.push_back(int64_t(f->external.size()));
      for (ValueRef e : f->external) state.push_back(JitGraphView::value(e));
    }
  }
  if (!why.empty()) {
    c.decision.verdict = Decision::Verdict::Kept;
    c.decision.text = std::to_string(c.blocks.size()) + " coupling(s): a function: " + why;
    ctx.remarks.add(std::move(c.decision));
    return;
  }
  const Coupling& first = c.blocks.front();
  const Coupling& last = c.blocks.back();
  Value* x1 = JitGraphView::value(first.x1);
  Value* x2 = JitGraphView::value(first.x2);
  Value* y1 = JitGraphView::value(last.y1);
  Value* y2 = JitGraphView::value(last.y2);
  Node* point = JitGraphView::node(last.add2);
  Proposal prop;
  prop.site = c.decision.site;
  for (NodeRef n : c.covers) prop.covers.push_back(JitGraphView::node(n));
  for (ValueRef v : c.guarded) prop.guarded.push_back(JitGraphView::value(v));
  std::vector<int64_t> kinds = c.link_kinds;
  std::vector<Value*> dims;
  for (ValueRef d : c.link_dims) dims.push_back(d ? JitGraphView::value(d) : nullptr);
  const int64_t every = ctx.policy.coupling_anchor_every;
  const double bound = ctx.policy.coupling_drift_bound;
  std::unordered_set<const Node*> covered(prop.covers.begin(), prop.covers.end());
  // All-additive chains leave `combine` empty (the op's default).
  if (!affine) combine.clear();
  prop.apply = [&g, x1, x2, y1, y2, point, texts, arity, state, kinds, dims, every, bound, combine,
                covered]() {
    torch::jit::WithInsertPoint guard(point);
    Value* list = insert_state_list(*g, state);
    std::vector<Value*> strs;
    for (const std::string& t : texts) strs.push_back(g->insertConstant(c10::IValue(t)));
    Value* fns = g->insertNode(g->createList(c10::StringType::get(), strs))->output();
    // (kind, cat dim, chunk dim) per link.
    std::vector<Value*> link_args;
    for (size_t i = 0; i < kinds.size(); ++i) {
      link_args.push_back(g->insertConstant(kinds[i]));
      for (Value* d : {dims[2 * i], dims[2 * i + 1]})
        link_args.push_back(d ? d : g->insertConstant(int64_t(0)));
    }
    Value* links = g->insertNode(g->createList(c10::IntType::get(), link_args))->output();
    Node* op = g->insertNode(
        g->create(c10::Symbol::fromQualString(kCouplingChainOp),
                  {x1, x2, list, fns, g->insertConstant(c10::IValue(arity)), links,
                   g->insertConstant(c10::IValue(every)), g->insertConstant(c10::IValue(bound)),
                   g->insertConstant(c10::IValue(combine))},
                  2));
    redirect_outside_uses(y1, op->output(0), covered);
    redirect_outside_uses(y2, op->output(1), covered);
    return std::string();
  };
  prop.rewrote = c.decision.text;
  prop.price = c.decision.price;
  ctx.gate->submit(prop);
}

} // namespace

void run_invertible_couplings(const std::shared_ptr<Graph>& g, PassContext& ctx) {
  const JitGraphView view(g);
  // One chain at a time, found again on the graph as the last rewrite left it:
  // a chain whose input an earlier chain's op now makes must read that op's
  // output (fuzz: a later chain kept the earlier chain's destroyed value).
  std::unordered_set<std::string> tried;
  for (;;) {
    std::vector<CouplingChain> chains = find_coupling_chains(view, ctx.policy);
    CouplingChain* next = nullptr;
    for (CouplingChain& c : chains)
      if (c.rewrite() && !tried.count(c.decision.site)) {
        next = &c;
        break;
      }
    if (!next) {
      for (CouplingChain& c : chains)
        if (!c.rewrite()) ctx.remarks.add(std::move(c.decision));
      return;
    }
    tried.insert(next->decision.site);
    submit_chain(g, *next, ctx);
  }
}

} // namespace memslim
