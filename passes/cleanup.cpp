//===- cleanup.cpp - remove what rewrites left unread, then lint ------------===//
//
// What: removes nodes whose outputs nobody reads and that neither write in
// place, have side effects nor draw random numbers, in every block; then
// lints the graph.
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

bool removable(const Node* n) {
  if (!n->blocks().empty()) return false;
  for (const torch::jit::Value* o : n->outputs())
    if (o->hasUses()) return false;
  const c10::Symbol k = n->kind();
  if (k == c10::prim::Constant || k == c10::prim::ListConstruct ||
      k == c10::prim::TupleConstruct || k == c10::prim::ListUnpack ||
      k == c10::prim::TupleUnpack || k == c10::prim::GetAttr)
    return true;
  const c10::FunctionSchema* s = n->maybeSchema();
  if (!s || s->is_mutable()) return false;
  return !n->hasSideEffects() && !SavedTensorAnalysis::draws_random(n);
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
