//===- cleanup.cpp - remove what rewrites left unread, then lint ------------===//
//
// What: removes nodes whose outputs nobody reads and that neither write in
// place, have side effects nor draw random numbers, in every block (an If or
// Loop when nothing inside does either); then lints the graph.
// Why not torch's EliminateDeadCode: it trusts AliasDb to tell whether an
// in-place write is observable, and AliasDb cannot see that dropout returns
// its input when not training (no alias in its schema): `d = dropout(h, p,
// training); tanh_(d)` lost its write to h under it (a fuzzer finding).
// Rewrites only leave functional nodes dead (a formula's intermediates, a
// replaced activation), so keeping every writer costs nothing here; keeping
// random ops keeps the RNG stream what the original graph draws.
//
//===----------------------------------------------------------------------===//
#include "memslim/passes/pass.h"
#include "memslim/passes/saved_tensor_analysis.h"

namespace memslim {

using torch::jit::Block;
using torch::jit::Node;

namespace {

// Whether running `n` changes nothing but its outputs: no in-place write, no
// side effect, no random draw, here or in its blocks.
bool pure(const Node* n) {
  const c10::Symbol k = n->kind();
  if (k == c10::prim::Constant || k == c10::prim::ListConstruct ||
      k == c10::prim::TupleConstruct || k == c10::prim::ListUnpack ||
      k == c10::prim::TupleUnpack || k == c10::prim::GetAttr)
    return true;
  if (k == c10::prim::If || k == c10::prim::Loop) {
    for (const Block* b : n->blocks())
      for (const Node* m : b->nodes())
        if (!pure(m)) return false;
    return true;
  }
  if (!n->blocks().empty()) return false;
  const c10::FunctionSchema* s = n->maybeSchema();
  if (!s || s->is_mutable()) return false;
  return !n->hasSideEffects() && !SavedTensorAnalysis::draws_random(n);
}

// A dead If or Loop goes too when everything in it is pure: a dead loop kept
// what it read alive, so a region was rewritten whose result nobody used, and
// TorchScript's executor, which deletes such code only after forming its
// DifferentiableGraphs around the region, grouped linear -> abs -> div into one
// graph keeping the linear's output, which sigmoid_ then wrote (long-fuzz seed
// 246750; the unmodified graph lost that code first and formed no graph).
bool removable(const Node* n) {
  for (const torch::jit::Value* o : n->outputs())
    if (o->hasUses()) return false;
  return pure(n);
}

// Removes dead nodes of `b` (last first, so chains go in one sweep).
void sweep(Block* b) {
  std::vector<Node*> nodes(b->nodes().begin(), b->nodes().end());
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    for (Block* inner : (*it)->blocks()) sweep(inner);
    if (removable(*it)) (*it)->destroy();
  }
}

} // namespace

void run_cleanup(const std::shared_ptr<torch::jit::Graph>& g, PassContext&) {
  sweep(g->block());
  g->lint();
}

} // namespace memslim
