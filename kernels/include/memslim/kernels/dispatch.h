//===- dispatch.h - runtime (Act, DType) -> template instantiation ---------===//
//
// What: turns the type-erased launcher arguments into typed params structs and
// calls a functor template with the right <Act, storage type>. Shared by the
// CPU loops and the CUDA launchers so both instantiate the same bodies.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/kernels/elementwise.h"
#include "memslim/kernels/launch.h"

namespace memslim {
namespace kernels {

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename S>
ForwardParams<S> typed(const ForwardArgs& a) {
  ForwardParams<S> p;
  p.x = static_cast<const S*>(a.x);
  p.y = static_cast<S*>(a.y);
  p.bits = a.bits;
  p.n = a.n;
  p.act = a.act;
  p.aligned = aligned16(a.x) && (a.y == nullptr || aligned16(a.y));
  p.exact_idx = a.exact_idx;
  p.exact_val = static_cast<S*>(a.exact_val);
  p.exact_count = a.exact_count;
  p.exact_cap = a.exact_cap;
  return p;
}
template <typename S>
BackwardParams<S> typed(const BackwardArgs& a) {
  BackwardParams<S> p;
  p.grad = static_cast<const S*>(a.grad);
  p.y = static_cast<const S*>(a.y);
  p.bits = a.bits;
  p.grad_in = static_cast<S*>(a.grad_in);
  p.n = a.n;
  p.act = a.act;
  p.aligned = aligned16(a.grad) && aligned16(a.grad_in) && (a.y == nullptr || aligned16(a.y));
  return p;
}
template <typename S>
FixupParams<S> typed(const FixupArgs& a) {
  FixupParams<S> p;
  p.idx = a.idx;
  p.val = static_cast<const S*>(a.val);
  p.grad = static_cast<const S*>(a.grad);
  p.grad_in = static_cast<S*>(a.grad_in);
  p.count = a.count;
  p.act = a.act;
  return p;
}

// F is a class template with `template <Act A, typename S> static void run(Args&&...)`.
template <typename F, Act A, typename... Args>
void dispatch_dtype(DType t, Args&&... args) {
  switch (t) {
    case DType::Float:
      F::template run<A, float>(args...);
      break;
    case DType::Double:
      F::template run<A, double>(args...);
      break;
    case DType::Half:
      F::template run<A, half_t>(args...);
      break;
    case DType::BFloat16:
      F::template run<A, bf16_t>(args...);
      break;
  }
}

template <typename F, typename... Args>
void dispatch(Act a, DType t, Args&&... args) {
  switch (a) {
#define MEMSLIM_ACT(ENUM, NAME, SAVE, NPARAMS, PARAM_NAMES) \
  case Act::ENUM:                                           \
    dispatch_dtype<F, Act::ENUM>(t, args...);               \
    break;
#include "memslim/kernels/activation_table.def"
    default:
      break;
  }
}

} // namespace kernels
} // namespace memslim
