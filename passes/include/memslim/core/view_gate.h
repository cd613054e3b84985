//===- view_gate.h - the FX front end's safety gate, over a GraphView ------===//
//
// What: the one check every FX rewrite passes before it is applied: no node
// after the site writes in place (a `(a!)` schema argument) a tensor that
// shares storage with a guarded value. Storage is followed through views
// (schema alias annotations), in-place results (which return what they wrote)
// and dropouts (which return their input when p == 0 or not training).
// Why this and not the TorchScript gate: that one needs AliasDb and guards
// TorchScript's executor (DifferentiableGraphs, peephole folding). Aten-level
// FX graphs are differentiated by eager autograd, and their only aliasing is
// what their schemas declare plus dropout's.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

#include "memslim/core/graph_view.h"

namespace memslim {

class ViewGate {
 public:
  explicit ViewGate(const GraphView& g) : g_(g), order_(g.nodes()) {}
  // "" when the rewrite at `site` guarding `guarded` may be applied; else why not.
  std::string check(NodeRef site, const std::vector<ValueRef>& guarded) const;
  // The tensor whose storage `v` is.
  ValueRef storage_root(ValueRef v) const;

 private:
  const GraphView& g_;
  std::vector<NodeRef> order_;
};

} // namespace memslim
