//===- plain_cpu.h - may a raw-pointer CPU kernel read this tensor? --------===//
//
// What: real_data(t): a tensor whose values can be read, not a fake /
// functional / subclass tensor (torch.compile's tracing and opcheck run the
// runtime's ops on those), no symbolic sizes, not meta: checks that read
// values (.item()) run on such tensors only. plain_cpu(t): real data on the
// CPU; the runtime's own CPU loops (kernels/) run only on such tensors,
// anything else takes aten's ops.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>

namespace memslim {

inline bool real_data(const at::Tensor& t) {
  const auto ks = t.key_set();
  return t.has_storage() && !ks.has(c10::DispatchKey::Python) &&
         !ks.has(c10::DispatchKey::Functionalize) &&
         !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() && !t.is_meta();
}

inline bool plain_cpu(const at::Tensor& t) {
  return t.key_set().has(c10::DispatchKey::CPU) && real_data(t);
}

} // namespace memslim
