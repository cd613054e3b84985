//===- functionalize.h - the in-place activation decision, any view --------===//
//
// What: whether an in-place aten activation (`aten::silu_`, `hardswish_`,
// `relu_`, ...: the ones output-saving knows) should become its functional
// form, over a GraphView. The rewrite pays only where the in-place form keeps
// what the functional form keeps (relu_, leaky_relu_, elu_ keep their output,
// the functional leaky_relu / elu their input: functionalizing those would
// make the model keep more). Each front end's safety gate then proves nothing
// else observes the write (its input is fresh and has no other use).
// Why: torchvision builds EfficientNet's SiLU and MobileNetV3's Hardswish with
// inplace=True; the output-saving rewrite matches functional ops only.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kFunctionalizePass = "functionalize-inplace-activations";

// "aten::silu" for "aten::silu_" when output-saving knows the functional op.
std::optional<std::string> functional_of(const std::string& kind);

struct FunctionalizeDecision {
  Decision decision;      // Rewrote (sentence) or Kept (reason)
  std::string functional; // "aten::silu"
  ValueRef written;       // the input the in-place op writes (the gate proves it unobserved)
  ValueRef guarded;       // the output: later in-place writes to it refuse the rewrite
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};
// nullopt: `n` is no site (not an in-place activation output-saving knows).
std::optional<FunctionalizeDecision> decide_functionalize(const GraphView& g, NodeRef n);

} // namespace memslim
