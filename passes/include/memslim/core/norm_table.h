//===- norm_table.h - what aten and memslim norms keep ----------------------===//
//
// What: for each norm the output-saving rewrite knows (norm_table.def): its
// aten and memslim op names, where gamma and beta sit among its arguments,
// what aten keeps beyond the input and the added work. Why: the norm pass
// prices and guards from these columns, the saved-tensor table reads them.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/interned_strings.h>

#include <optional>

namespace memslim {

struct NormInfo {
  c10::Symbol aten;    // aten::layer_norm
  c10::Symbol memslim; // memslim::layer_norm
  int weight_arg;      // argument index of gamma (-1: none)
  int bias_arg;        // argument index of beta (-1: none)
  // Full-size tensors aten keeps beyond its input, in opmath dtype (rms_norm: 1).
  int aten_extra;
  // Added elementwise passes over aten's backward.
  double added_work;
};

// The norm `kind` is (aten or memslim), or nullopt.
std::optional<NormInfo> norm_info(c10::Symbol kind);

} // namespace memslim
