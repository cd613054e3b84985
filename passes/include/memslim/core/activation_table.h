//===- activation_table.h - what aten and memslim activations keep ---------===//
//
// What: for each activation the rewrite knows, its aten and memslim op names
// and what each one's autograd keeps for backward (read from the one table,
// kernels/include/memslim/kernels/activation_table.def). Why: the cost model
// prices a rewrite from these two columns, never from op names alone.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/interned_strings.h>

#include <optional>
#include <string>

namespace memslim {

enum class Keeps { Input, Output, OutputAndBits, Bits };

struct ActivationInfo {
  c10::Symbol aten;    // aten::gelu
  c10::Symbol memslim; // memslim::gelu
  Keeps aten_keeps;
  Keeps memslim_keeps;
  // What aten's in-place form (`aten::relu_`) keeps: its output, or a copy of
  // its input (measured with saved_tensors_hooks on torch 2.14).
  Keeps inplace_keeps;
  // Extra work of the memslim op over aten's, in activation evaluations per
  // element (measured on the CPU, README speed table: inverting ones ~1-2).
  double added_work;
};

// The activation `kind` is, or nullopt.
std::optional<ActivationInfo> activation_info(c10::Symbol kind);

const char* keeps_name(Keeps k);

} // namespace memslim
