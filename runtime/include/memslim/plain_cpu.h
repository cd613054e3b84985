//===- plain_cpu.h - may a raw-pointer CPU kernel read this tensor? --------===//
//
// What: plain_cpu(t): a dense CPU tensor with real data, not a fake /
// functional / subclass tensor (torch.compile's tracing and opcheck run the
// runtime's kernels on those), no symbolic sizes. The runtime's own CPU loops
// (kernels/) run only on such tensors; anything else takes aten's ops.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>

namespace memslim {

inline bool plain_cpu(const at::Tensor& t) {
  const auto ks = t.key_set();
  return ks.has(c10::DispatchKey::CPU) && !ks.has(c10::DispatchKey::Python) &&
         !ks.has(c10::DispatchKey::Functionalize) &&
         !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() && t.has_storage();
}

} // namespace memslim
