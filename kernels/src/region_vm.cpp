//===- region_vm.cpp - what the region program's loops share ---------------===//
//
// What: region_vm.h's instruction-set independent parts: which ops are
// differentiable and which registers' gradients a backward needs.
//
//===----------------------------------------------------------------------===//
#include "memslim/kernels/region_vm.h"

#include <cstddef>

namespace memslim {
namespace kernels {
namespace region {

namespace {
// The ops before Gt in region_vm.h's enum; the rest give 0 / 1 values.
bool differentiable(Op op) { return op < Op::Gt; }
} // namespace

std::vector<uint8_t> needed_gradients(const Program& p, const std::vector<uint8_t>& wrt,
                                      const std::vector<uint8_t>& live_out) {
  const std::size_t regs = static_cast<size_t>(p.n_regs);
  std::vector<uint8_t> reach(regs, 0), live(regs, 0), need(regs, 0);
  for (std::size_t r = 0; r < wrt.size() && r < regs; ++r) reach[r] = wrt[r];
  // Where's condition (operand a) carries no gradient; every other operand of
  // a differentiable op does.
  auto operands = [](const Instr& in, auto&& fn) {
    if (in.op != Op::Where && in.a >= 0) fn(in.a);
    if (in.b >= 0) fn(in.b);
    if (in.c >= 0) fn(in.c);
  };
  for (const Instr& in : p.code) {
    if (!differentiable(in.op)) continue;
    bool r = false;
    operands(in, [&](int32_t v) { r = r || reach[v]; });
    reach[in.dst] = r;
  }
  for (std::size_t k = 0; k < p.outputs.size() && k < live_out.size(); ++k)
    if (live_out[k]) live[p.outputs[k]] = 1;
  for (auto it = p.code.rbegin(); it != p.code.rend(); ++it) {
    if (!live[it->dst] || !reach[it->dst] || !differentiable(it->op)) continue;
    operands(*it, [&](int32_t v) { live[v] = 1; });
  }
  for (std::size_t r = 0; r < regs; ++r) need[r] = reach[r] && live[r];
  return need;
}

} // namespace region
} // namespace kernels
} // namespace memslim
