//===- test_perturb_outputs.cpp - a deliberately wrong pass, for tests ------===//
//
// What: `test-perturb-outputs` multiplies every floating-point tensor the graph
// returns by 1.001 (a relative error of 1e-3). It is in no pipeline and never
// runs unless named.
// Why: the checks that must catch a wrong rewrite (memslim-opt --verify, the
// fuzzer's judge) need a rewrite known to be wrong to show they fail on one
// (mlir-opt's -test-* passes play the same role). It bypasses the SafetyGate on
// purpose: what it does is wrong by design and the gate only checks safety.
//
//===----------------------------------------------------------------------===//
#include "memslim/jit/pass.h"

namespace memslim {

void run_test_perturb_outputs(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  torch::jit::WithInsertPoint guard(g->return_node());
  torch::jit::Value* factor = g->insertConstant(1.001);
  for (size_t i = 0; i < g->outputs().size(); ++i) {
    torch::jit::Value* out = g->outputs()[i];
    const auto t = out->type()->cast<c10::TensorType>();
    if (!t) continue;
    if (t->scalarType() && !at::isFloatingType(*t->scalarType())) continue;
    torch::jit::Value* scaled = g->insert(c10::aten::mul, {out, factor});
    scaled->setType(out->type());
    g->return_node()->replaceInput(i, scaled);
    ctx.remarks.note("test-perturb-outputs", "scaled output " + std::to_string(i) + " by 1.001");
  }
}

} // namespace memslim
