//===- region_vm.h - one fused CPU loop for a pointwise region --------------===//
//
// What: a recompute region's full-size ops lowered to a straight-line program
// over registers, and the CPU loops that run it: the forward in one pass over
// the inputs (every intermediate lives in an L1-sized chunk buffer, never in
// memory), the backward in one pass that recomputes the chunk's values and
// walks the program in reverse (vector-Jacobian products of aten's own
// derivative formulas), writing the input gradients and summing the gradients
// of broadcast scalars (a trainable 0-dim order). The runtime
// (runtime/region_kernel.cpp) builds the program from the region's graph and
// evaluates the ops whose operands are all scalars with aten.
// Why: the interpreter path runs the region as one aten op per node, and its
// backward re-runs the region under autograd: every intermediate is written
// and read back, twice (profiled: the FracAct regions were 450 of resnet18's
// 630 ms per step, eager's own chain 300).
// Registers: [0, n_full) the full-size inputs, [n_full, n_full + n_scalar)
// scalars broadcast over the chunk, then one per instruction (SSA). Boolean
// values are 0 / 1 floats.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace memslim {
namespace kernels {
namespace region {

enum class Op : uint8_t {
  // Differentiable, dst = f(a) or f(a, b).
  Add,
  Sub,
  Mul,
  Div,
  Pow,      // powf(a, b) elementwise (aten's pow.Tensor_Tensor)
  PowConst, // a ** imm (aten's pow.Tensor_Scalar, with its special exponents)
  Neg,
  Exp,
  Log,
  Sigmoid,
  Tanh,
  Sqrt,
  Rsqrt,
  Reciprocal,
  Expm1,
  Log1p,
  Relu,
  ClampMin, // max(a, b), NaN kept; b a number (aten's Scalar overloads)
  ClampMax, // min(a, b), NaN kept
  Where,    // a ? b : c
  // Not differentiable: 0 / 1 results.
  Gt,
  Lt,
  Ge,
  Le,
  Eq,
  Ne,
  And,
  Or,
  Xor,
  Not,
};

struct Instr {
  Op op;
  int32_t dst = -1, a = -1, b = -1, c = -1;
  double imm = 0; // PowConst's exponent
};

struct Program {
  int32_t n_full = 0, n_scalar = 0, n_regs = 0;
  std::vector<Instr> code;
  std::vector<int32_t> outputs; // registers the region returns
};

struct ForwardCall {
  const float* const* in = nullptr; // n_full pointers
  const float* scalars = nullptr;   // n_scalar values
  float* const* out = nullptr;      // one per output
};

struct BackwardCall {
  const float* const* in = nullptr;
  const float* scalars = nullptr;
  const float* const* grad_out = nullptr; // one per output; null: no gradient
  float* const* grad_in = nullptr;        // one per full input; null: not wanted
  const uint8_t* need = nullptr;          // per register: its gradient is wanted
  double* scalar_grad = nullptr;          // per scalar register, added to
};

// Which registers need a gradient: reached from a register in `wrt` through
// differentiable operands and reaching an output in `live_out`.
std::vector<uint8_t> needed_gradients(const Program& p, const std::vector<uint8_t>& wrt,
                                      const std::vector<uint8_t>& live_out);

// Elements [b, e) of every full input and output (all of one shape, contiguous).
void region_forward_cpu(const Program& p, const ForwardCall& c, int64_t b, int64_t e);
void region_backward_cpu(const Program& p, const BackwardCall& c, int64_t b, int64_t e);

} // namespace region
} // namespace kernels
} // namespace memslim
