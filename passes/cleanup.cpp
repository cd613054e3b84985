//===- cleanup.cpp - DCE and lint after rewrites ---------------------------===//
//
// What: removes nodes the rewrites left without uses and lints the graph.
// Why: every pipeline ends here so a broken rewrite fails loudly, not later.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include "memslim/passes/pass.h"

namespace memslim {

void run_cleanup(const std::shared_ptr<torch::jit::Graph>& g, PassContext&) {
  torch::jit::EliminateDeadCode(g);
  g->lint();
}

} // namespace memslim
