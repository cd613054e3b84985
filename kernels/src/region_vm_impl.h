//===- region_vm_impl.h - the region program's CPU loops (one ISA per TU) ---===//
//
// What: region_forward_cpu / region_backward_cpu of region_vm.h for one
// instruction set: each range is cut into chunks of kRegionChunk elements,
// every instruction is one straight loop over the chunk (GCC vectorises them,
// the transcendental ones with libmvec), values and gradients live in a
// per-thread scratch buffer. The formulas are aten's: the forward ones its CPU
// kernels' (pow's special exponents, sigmoid as 1 / (1 + exp(-x)), clamps that
// keep NaN), the backward ones derivatives.yaml's (pow's zero-exponent and
// zero-base cases, where's zeros, threshold_backward for relu).
// Included by cpu_loops.cpp / cpu_loops_avx2.cpp / cpu_loops_avx512.cpp after
// cpu_loops_impl.h, inside namespace MEMSLIM_CPU_NS.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cstring>
#include <vector>

#include "memslim/kernels/region_vm.h"

namespace memslim {
namespace kernels {
namespace MEMSLIM_CPU_NS {
namespace region {

using kernels::region::BackwardCall;
using kernels::region::ForwardCall;
using kernels::region::Instr;
using kernels::region::Op;
using kernels::region::Program;

constexpr int64_t kRegionChunk = 256;

// aten's pow(Tensor, Scalar) on CPU: exponents 0, 1, 2, 3, 0.5, -0.5, -1 and -2
// are computed without pow (sqrt(-inf) is NaN where powf(-inf, 0.5) is inf).
void pow_const(float* __restrict d, const float* __restrict a, double e, int64_t n) {
  if (e == 0) {
    std::fill(d, d + n, 1.f);
  } else if (e == 1) {
    std::memcpy(d, a, sizeof(float) * n);
  } else if (e == 2) {
    for (int64_t i = 0; i < n; ++i) d[i] = a[i] * a[i];
  } else if (e == 3) {
    for (int64_t i = 0; i < n; ++i) d[i] = a[i] * a[i] * a[i];
  } else if (e == 0.5) {
    for (int64_t i = 0; i < n; ++i) d[i] = sqrtf(a[i]);
  } else if (e == -0.5) {
    for (int64_t i = 0; i < n; ++i) d[i] = 1.f / sqrtf(a[i]);
  } else if (e == -1) {
    for (int64_t i = 0; i < n; ++i) d[i] = 1.f / a[i];
  } else if (e == -2) {
    for (int64_t i = 0; i < n; ++i) d[i] = 1.f / (a[i] * a[i]);
  } else {
    const float ef = static_cast<float>(e);
    for (int64_t i = 0; i < n; ++i) d[i] = powf(a[i], ef);
  }
}

#define MEMSLIM_LOOP(EXPR)                                         \
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(EXPR); \
  break

void run_instr(const Instr& in, float* const* R, int64_t n) {
  float* __restrict d = R[in.dst];
  const float* __restrict a = in.a >= 0 ? R[in.a] : nullptr;
  const float* __restrict b = in.b >= 0 ? R[in.b] : nullptr;
  const float* __restrict c = in.c >= 0 ? R[in.c] : nullptr;
  switch (in.op) {
    case Op::Add:
      MEMSLIM_LOOP(a[i] + b[i]);
    case Op::Sub:
      MEMSLIM_LOOP(a[i] - b[i]);
    case Op::Mul:
      MEMSLIM_LOOP(a[i] * b[i]);
    case Op::Div:
      MEMSLIM_LOOP(a[i] / b[i]);
    case Op::Pow:
      MEMSLIM_LOOP(powf(a[i], b[i]));
    case Op::PowConst:
      pow_const(d, a, in.imm, n);
      break;
    case Op::Neg:
      MEMSLIM_LOOP(-a[i]);
    case Op::Exp:
      MEMSLIM_LOOP(expf(a[i]));
    case Op::Log:
      MEMSLIM_LOOP(logf(a[i]));
    case Op::Sigmoid:
      MEMSLIM_LOOP(1.f / (1.f + expf(-a[i])));
    case Op::Tanh:
      MEMSLIM_LOOP(tanhf(a[i]));
    case Op::Sqrt:
      MEMSLIM_LOOP(sqrtf(a[i]));
    case Op::Rsqrt:
      MEMSLIM_LOOP(1.f / sqrtf(a[i]));
    case Op::Reciprocal:
      MEMSLIM_LOOP(1.f / a[i]);
    case Op::Expm1:
      MEMSLIM_LOOP(expm1f(a[i]));
    case Op::Log1p:
      MEMSLIM_LOOP(log1pf(a[i]));
    case Op::Relu:
      MEMSLIM_LOOP(a[i] < 0.f ? 0.f : a[i]); // -0 and NaN kept, as clamp_min
    case Op::ClampMin:
      MEMSLIM_LOOP(a[i] != a[i] ? a[i] : b[i] != b[i] ? b[i] : a[i] < b[i] ? b[i] : a[i]);
    case Op::ClampMax:
      MEMSLIM_LOOP(a[i] != a[i] ? a[i] : b[i] != b[i] ? b[i] : a[i] > b[i] ? b[i] : a[i]);
    case Op::Where:
      MEMSLIM_LOOP(a[i] != 0.f ? b[i] : c[i]);
    case Op::Gt:
      MEMSLIM_LOOP(a[i] > b[i] ? 1.f : 0.f);
    case Op::Lt:
      MEMSLIM_LOOP(a[i] < b[i] ? 1.f : 0.f);
    case Op::Ge:
      MEMSLIM_LOOP(a[i] >= b[i] ? 1.f : 0.f);
    case Op::Le:
      MEMSLIM_LOOP(a[i] <= b[i] ? 1.f : 0.f);
    case Op::Eq:
      MEMSLIM_LOOP(a[i] == b[i] ? 1.f : 0.f);
    case Op::Ne:
      MEMSLIM_LOOP(a[i] != b[i] ? 1.f : 0.f);
    case Op::And:
      MEMSLIM_LOOP(a[i] != 0.f && b[i] != 0.f ? 1.f : 0.f);
    case Op::Or:
      MEMSLIM_LOOP(a[i] != 0.f || b[i] != 0.f ? 1.f : 0.f);
    case Op::Xor:
      MEMSLIM_LOOP((a[i] != 0.f) != (b[i] != 0.f) ? 1.f : 0.f);
    case Op::Not:
      MEMSLIM_LOOP(a[i] == 0.f ? 1.f : 0.f);
  }
}
#undef MEMSLIM_LOOP

// Adds the instruction's vector-Jacobian products to its operands' gradients
// G (null where not wanted); V holds the values, `tmp` is one chunk of scratch.
void run_vjp(const Instr& in, float* const* V, float* const* G, float* __restrict tmp, int64_t n) {
  const float* __restrict g = G[in.dst];
  const float* __restrict y = V[in.dst];
  const float* __restrict a = in.a >= 0 ? V[in.a] : nullptr;
  const float* __restrict b = in.b >= 0 ? V[in.b] : nullptr;
  // (Not restrict: mul(x, x) accumulates into one gradient twice.)
  float* ga = in.a >= 0 ? G[in.a] : nullptr;
  float* gb = in.b >= 0 ? G[in.b] : nullptr;
  float* gc = in.c >= 0 ? G[in.c] : nullptr;
#define MEMSLIM_ACC(G_, EXPR) \
  if (G_)                     \
    for (int64_t i = 0; i < n; ++i) G_[i] += static_cast<float>(EXPR);
  switch (in.op) {
    case Op::Add:
      MEMSLIM_ACC(ga, g[i]);
      MEMSLIM_ACC(gb, g[i]);
      break;
    case Op::Sub:
      MEMSLIM_ACC(ga, g[i]);
      MEMSLIM_ACC(gb, -g[i]);
      break;
    case Op::Mul:
      MEMSLIM_ACC(ga, g[i] * b[i]);
      MEMSLIM_ACC(gb, g[i] * a[i]);
      break;
    case Op::Div:
      MEMSLIM_ACC(ga, g[i] / b[i]);
      MEMSLIM_ACC(gb, -g[i] * ((a[i] / b[i]) / b[i]));
      break;
    case Op::Pow: // pow_backward_self / pow_backward_exponent
      MEMSLIM_ACC(ga, b[i] == 0.f ? 0.f : g[i] * (b[i] * powf(a[i], b[i] - 1.f)));
      MEMSLIM_ACC(gb, g[i] * (b[i] >= 0.f && a[i] == 0.f ? 0.f : y[i] * logf(a[i])));
      break;
    case Op::PowConst: // pow_backward: grad * (e * self.pow(e - 1)), 0 for e == 0
      if (ga && in.imm != 0) {
        pow_const(tmp, a, in.imm - 1, n);
        const float ef = static_cast<float>(in.imm);
        for (int64_t i = 0; i < n; ++i) ga[i] += g[i] * (ef * tmp[i]);
      }
      break;
    case Op::Neg:
      MEMSLIM_ACC(ga, -g[i]);
      break;
    case Op::Exp:
      MEMSLIM_ACC(ga, g[i] * y[i]);
      break;
    case Op::Log:
      MEMSLIM_ACC(ga, g[i] / a[i]);
      break;
    case Op::Sigmoid:
      MEMSLIM_ACC(ga, g[i] * (1.f - y[i]) * y[i]);
      break;
    case Op::Tanh:
      MEMSLIM_ACC(ga, g[i] * (1.f - y[i] * y[i]));
      break;
    case Op::Sqrt:
      MEMSLIM_ACC(ga, g[i] / (2.f * y[i]));
      break;
    case Op::Rsqrt:
      MEMSLIM_ACC(ga, (-0.5f * g[i]) * (y[i] * y[i] * y[i]));
      break;
    case Op::Reciprocal:
      MEMSLIM_ACC(ga, -g[i] * (y[i] * y[i]));
      break;
    case Op::Expm1:
      MEMSLIM_ACC(ga, g[i] * (y[i] + 1.f));
      break;
    case Op::Log1p:
      MEMSLIM_ACC(ga, g[i] / (a[i] + 1.f));
      break;
    case Op::Relu:
      MEMSLIM_ACC(ga, y[i] <= 0.f ? 0.f : g[i]);
      break;
    case Op::ClampMin: // clamp_min.Scalar: strict, NaN gets 0 (the bound is a number)
      MEMSLIM_ACC(ga, a[i] > b[i] ? g[i] : 0.f);
      break;
    case Op::ClampMax:
      MEMSLIM_ACC(ga, a[i] < b[i] ? g[i] : 0.f);
      break;
    case Op::Where:
      MEMSLIM_ACC(gb, a[i] != 0.f ? g[i] : 0.f);
      MEMSLIM_ACC(gc, a[i] != 0.f ? 0.f : g[i]);
      break;
    default:
      break; // not differentiable
  }
#undef MEMSLIM_ACC
}

// Per-thread scratch: values of the non-input registers, gradients, one temp.
struct Scratch {
  std::vector<float> buf;
  std::vector<float*> val, grad;
};
Scratch& scratch_for(const Program& p, bool with_grads) {
  thread_local Scratch s;
  const size_t regs = static_cast<size_t>(p.n_regs);
  const size_t need = (regs + (with_grads ? regs + 1 : 0)) * kRegionChunk;
  if (s.buf.size() < need) s.buf.resize(need);
  s.val.assign(regs, nullptr);
  s.grad.assign(regs, nullptr);
  for (size_t r = p.n_full; r < regs; ++r) s.val[r] = s.buf.data() + r * kRegionChunk;
  return s;
}

void fill_scalars(const Program& p, const float* scalars, Scratch& s) {
  for (int32_t k = 0; k < p.n_scalar; ++k)
    std::fill(s.val[p.n_full + k], s.val[p.n_full + k] + kRegionChunk, scalars[k]);
}

void region_forward_cpu(const Program& p, const ForwardCall& c, int64_t b, int64_t e) {
  Scratch& s = scratch_for(p, false);
  fill_scalars(p, c.scalars, s);
  for (int64_t off = b; off < e; off += kRegionChunk) {
    const int64_t n = std::min(kRegionChunk, e - off);
    for (int32_t k = 0; k < p.n_full; ++k) s.val[k] = const_cast<float*>(c.in[k] + off);
    for (const Instr& in : p.code) run_instr(in, s.val.data(), n);
    for (size_t k = 0; k < p.outputs.size(); ++k)
      std::memcpy(c.out[k] + off, s.val[p.outputs[k]], sizeof(float) * n);
  }
}

void region_backward_cpu(const Program& p, const BackwardCall& c, int64_t b, int64_t e) {
  Scratch& s = scratch_for(p, true);
  fill_scalars(p, c.scalars, s);
  const size_t regs = static_cast<size_t>(p.n_regs);
  float* grads = s.buf.data() + regs * kRegionChunk;
  float* tmp = grads + regs * kRegionChunk;
  for (size_t r = 0; r < regs; ++r)
    if (c.need[r]) s.grad[r] = grads + r * kRegionChunk;
  for (int64_t off = b; off < e; off += kRegionChunk) {
    const int64_t n = std::min(kRegionChunk, e - off);
    for (int32_t k = 0; k < p.n_full; ++k) s.val[k] = const_cast<float*>(c.in[k] + off);
    for (const Instr& in : p.code) run_instr(in, s.val.data(), n);
    for (size_t r = 0; r < regs; ++r)
      if (s.grad[r]) std::fill(s.grad[r], s.grad[r] + n, 0.f);
    for (size_t k = 0; k < p.outputs.size(); ++k) {
      float* go = s.grad[p.outputs[k]];
      if (!go || !c.grad_out[k]) continue;
      const float* src = c.grad_out[k] + off;
      for (int64_t i = 0; i < n; ++i) go[i] += src[i];
    }
    for (auto it = p.code.rbegin(); it != p.code.rend(); ++it)
      if (s.grad[it->dst]) run_vjp(*it, s.val.data(), s.grad.data(), tmp, n);
    for (int32_t k = 0; k < p.n_full; ++k)
      if (c.grad_in[k] && s.grad[k]) std::memcpy(c.grad_in[k] + off, s.grad[k], sizeof(float) * n);
    for (int32_t k = 0; k < p.n_scalar; ++k) {
      const float* gs = s.grad[p.n_full + k];
      if (!gs) continue;
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += gs[i];
      c.scalar_grad[k] += sum;
    }
  }
}

} // namespace region
} // namespace MEMSLIM_CPU_NS
} // namespace kernels
} // namespace memslim
