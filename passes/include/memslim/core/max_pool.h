//===- max_pool.h - max-pooling keeps only where each maximum was, any view ===//
//
// What: whether an aten::max_pool2d should become memslim::max_pool2d (same
// arguments), which keeps the position of each maximum inside its window
// (int8 up to 127-element windows, else int16) instead of aten's input and
// int64 indices; its gradient is aten's bit for bit. Priced from the
// saved-tensor rules (the input is free where another op keeps it).
// Why: ResNet's stem pool keeps the ReLU's output for nothing but its shape;
// freed, output-saving turns that ReLU into a 1-bit mask.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kMaxPoolPass = "max-pool-positions";
inline constexpr const char* kMemslimMaxPool2d = "memslim::max_pool2d";

bool is_max_pool_site(const GraphView& g, NodeRef n);

struct MaxPoolDecision {
  Decision decision;
  std::vector<ValueRef> guarded; // the input (aten kept it), the output
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
MaxPoolDecision decide_max_pool(const GraphView& g, NodeRef n, const CostPolicy& policy);

} // namespace memslim
