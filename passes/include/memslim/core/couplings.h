//===- couplings.h - additive and affine coupling blocks and their chains --===//
//
// What: finds couplings after inlining, each half one of
//   y1 = x1 + F(x2)                      (additive: RevNet, Reformer, RevViT)
//   y1 = x1 * m + t,    (m, t) = F(x2)   (affine: RealNVP's x1 * exp(s) + t)
//   y1 = (x1 + t) * m,  (m, t) = F(x2)   (affine: Glow's sigmoid-scaled form)
// and y2 = x2 (+) G(y1) the same ways, where F is every top-level node that
// reads x2 (directly or through F's own values) before the half's combining
// nodes, G every one reading y1 before the second's, neither's values are
// read outside it, and what else they read (parameters, buffers, a mask,
// module flags) depends on neither block input; and links them into chains:
// block b's outputs are block b+1's inputs, directly or through
// chunk(cat([y1, y2], d), 2, d) (RevNet's and RevViT's layout; memcnn's with
// .contiguous() on each piece). A chain is
// priced as the bytes its nodes make autograd keep against its two outputs,
// and becomes memslim::coupling_chain (runtime/coupling_chain.cpp), which
// rebuilds each block's inputs in backward (x1 = y1 - f, (y1 - t) / m,
// y1 / m - t).
// Never a rewrite that changes the function: the op computes the same adds,
// muls and F / G graphs; only what is kept changes.
// Why here: matching and pricing are front-end neutral; the TorchScript pass
// (passes/invertible_couplings.cpp) cuts F and G out as graph text.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"
#include "memslim/core/top_level.h"

namespace memslim {

inline constexpr const char* kInvertibleCouplingsPass = "invertible-couplings";
inline constexpr const char* kCouplingChainOp = "memslim::coupling_chain";

// One function of a block (F or G): its top-level nodes in program order, the
// block value it reads (x2 / y1), the value it makes (f / g), and what else it
// reads (not constants), in order of first read.
using CouplingFn = FunctionCut;

// How a half combines its passing input x with its function's outputs; the
// numbers are memslim::coupling_chain's `combine` codes.
enum class Combine : int64_t {
  Add = 0,    // y = x + f                 (the function returns f)
  MulAdd = 1, // y = x * m + t             (returns (m, t))
  AddMul = 2, // y = (x + t) * m           (returns (m, t))
};
const char* combine_name(Combine c); // "additive" or "affine"

struct Coupling {
  // The node making y1 (y2), and the node before it in an affine half (x1 * m,
  // x1 + t; null for an additive one).
  NodeRef add1, add2, inner1, inner2;
  Combine combine1 = Combine::Add, combine2 = Combine::Add;
  ValueRef x1, x2, y1, y2;
  CouplingFn F, G; // an affine half's function: output m, output2 t
  // The half-combining nodes (2 to 4).
  std::vector<NodeRef> combine_nodes() const;
};

struct CouplingChain {
  Decision decision;            // Rewrote or Kept (why)
  std::vector<Coupling> blocks; // in order
  // Per link between blocks: 0 direct, 1 chunk(cat([y1, y2], d1), 2, d2), with
  // d1 and d2 (null for direct ones) constants or values (a module's `self.dim`).
  std::vector<int64_t> link_kinds;
  std::vector<ValueRef> link_dims;
  std::vector<NodeRef> covers;   // every node the op takes over, program order
  std::vector<ValueRef> guarded; // what must not be written after the first covered node
  int64_t kept_before = 0;       // bytes the covered nodes make autograd keep
  int64_t kept_after = 0;        // the chain's outputs
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};

// Every chain of couplings in the top-level block, each decided: Rewrote (the
// op frees memory) or Kept with the reason. Couplings that are found but
// cannot join the op (a value of F read elsewhere, an external read that
// depends on a block input, a type the op cannot carry) come back as Kept
// one-block chains.
std::vector<CouplingChain> find_coupling_chains(const GraphView& g, const CostPolicy& policy);

} // namespace memslim
