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
#include <unordered_set>

#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/saved_tensor_analysis.h"

namespace memslim {

using torch::jit::Block;
using torch::jit::Node;

namespace {

// Tensors a dropout that may return its input (eval mode, p == 0) hands on:
// their storage roots. A write to one is judged by torch's DCE, which cannot see
// that alias, through the tensor's other readers only: deleting a dead reader
// can make it delete the write (long-fuzz seed 263425: `v0[0].add_(1)` after
// `dropout(v0)` in eval mode; cleanup deleted a dead clone and loop reading v0,
// and the executor's DCE then deleted the write: outputs 0.58 off).
using Roots = std::unordered_set<const torch::jit::Value*>;

// Only roots something writes in place count: without a write, no reader
// matters (a formula's dead intermediates still go).
Roots hidden_roots(const std::shared_ptr<torch::jit::Graph>& g) {
  Roots dropped, written, roots;
  std::shared_ptr<torch::jit::Graph> gm = g;
  torch::jit::DepthFirstGraphNodeIterator it(gm);
  for (Node* n = it.next(); n; n = it.next()) {
    if (SavedTensorAnalysis::may_return_input(n))
      dropped.insert(SavedTensorAnalysis::storage_root(n->input(0)));
    for (const torch::jit::Value* w : SavedTensorAnalysis::written_inputs(n))
      written.insert(SavedTensorAnalysis::storage_root(w));
  }
  for (const torch::jit::Value* r : dropped)
    if (written.count(r)) roots.insert(r);
  return roots;
}

bool reads_hidden(const Node* n, const Roots& hidden) {
  if (hidden.empty()) return false;
  for (const torch::jit::Value* v : n->inputs())
    if (v->type()->cast<c10::TensorType>() && hidden.count(SavedTensorAnalysis::storage_root(v)))
      return true;
  return false;
}

// Whether running `n` changes nothing but its outputs (no in-place write, no
// side effect, no random draw) and reads no tensor whose writes only its
// readers make visible to torch's DCE. Ifs and Loops stay, dead or not: the
// user's dead control flow is TorchScript's to delete (removing a dead loop
// changed where the optimizing executor draws dropout masks on the first call:
// long-fuzz seed 282726). Rewrites of dead code are the gate's to refuse.
bool pure(const Node* n, const Roots& hidden) {
  return n->blocks().empty() && !SavedTensorAnalysis::has_effects(n) && !reads_hidden(n, hidden);
}

bool removable(const Node* n, const Roots& hidden) {
  for (const torch::jit::Value* o : n->outputs())
    if (o->hasUses()) return false;
  return pure(n, hidden);
}

// Removes dead nodes of `b` (last first, so chains go in one sweep).
void sweep(Block* b, const Roots& hidden) {
  std::vector<Node*> nodes(b->nodes().begin(), b->nodes().end());
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    for (Block* inner : (*it)->blocks()) sweep(inner, hidden);
    if (removable(*it, hidden)) (*it)->destroy();
  }
}

} // namespace

void run_cleanup(const std::shared_ptr<torch::jit::Graph>& g, PassContext&) {
  sweep(g->block(), hidden_roots(g));
  g->lint();
}

} // namespace memslim
