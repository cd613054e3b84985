//===- canonicalize.h - hand-written activations -> aten ops, any view -----===//
//
// What: recognises activations written out by hand (x * sigmoid(x), the tanh
// GELU formula, ...) over a GraphView and says which aten op replaces each,
// with the formula's nodes and the decision record. The matching rules and
// their reasons are in canonicalize.cpp's header.
// Why here: the TorchScript pass (passes/canonicalize_activations.cpp) and the
// FX front end (fx/fx_front_end.cpp) both match with these functions; each
// only submits the rewrite to its safety gate and applies it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kCanonicalizePass = "canonicalize-activations";

struct CanonicalizeDecision {
  Decision decision;       // Rewrote ("x * sigmoid(x) at %h -> aten::silu") or Kept (why)
  NodeRef root;            // the formula's last node: its output becomes op(x)
  ValueRef x;              // the activation's input
  std::string op;          // "aten::gelu"
  std::string approximate; // gelu's second argument ("tanh"), or "" for none
  // The formula's nodes (root last): every node between x and root. The gate
  // checks writes between them; those nobody reads after the rewrite go.
  std::vector<NodeRef> covers;
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};

// A number `v` holds as a constant: a double, an int, or a 0-dim tensor (how
// torch.jit.trace records a Python float); nullopt otherwise.
std::optional<double> scalar_constant(const GraphView& g, ValueRef v);

// An int[] `v` holds as a constant: a constant list, or a prim::ListConstruct of
// int constants (how TorchScript builds `[3, 3]`); nullopt otherwise.
std::optional<std::vector<int64_t>> int_list_constant(const GraphView& g, ValueRef v);

// The products to try, outermost first (an inner product of a matched formula
// is then gone before it is tried on its own).
std::vector<NodeRef> canonicalize_roots(const GraphView& g);
// The match rooted at `root`, or nullopt when it computes no known activation.
std::optional<CanonicalizeDecision> decide_canonicalize(const GraphView& g, NodeRef root);

} // namespace memslim
