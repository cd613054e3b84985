//===- view_gate.h - the FX front end's safety gate, over a GraphView ------===//
//
// What: the one check every FX rewrite passes before it is applied: no node
// after the site writes in place (a `(a!)` schema argument, a written list's
// element, or any tensor handed to a node without a schema) a tensor that
// shares storage with a guarded value. Storage is followed through views
// (schema alias annotations), in-place results (which return what they wrote)
// and dropouts (which return their input when p == 0 or not training).
// Its checks are rules of core/gate_rules.h, under the same names as the
// TorchScript gate's: write-after-guarded (check), grad-mode-between and
// write-between (check_between), observable-write (check_removed_write); the
// refusal_* forms name the rule beside the reason.
// Why this and not the TorchScript gate: that one needs AliasDb and guards
// TorchScript's executor (DifferentiableGraphs, peephole folding). Aten-level
// FX graphs are differentiated by eager autograd, and their only aliasing is
// what their schemas declare plus dropout's.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memslim/core/gate_rules.h"
#include "memslim/core/graph_view.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

// switches_grad_mode: core/saved_tensors.h.

// write_observable: core/saved_tensors.h.

// One per pass over a graph: it holds the node order (rewrites change kinds,
// which it reads live, not the order).
class ViewGate {
 public:
  explicit ViewGate(const GraphView& g) : g_(g), order_(g.nodes()) {}
  // "" when the rewrite at `site` guarding `guarded` may be applied; else why not.
  std::string check(NodeRef site, const std::vector<ValueRef>& guarded) const;
  // "" when no node between the first and the last of `covers` (a formula a
  // rewrite replaces by one op at the last) writes in place a tensor one of
  // them reads or switches the grad mode; else why not. writes = false: grad-mode
  // switches only (memslim.compile's recompute tags: Inductor recomputes on the
  // functionalized joint graph, where an in-place write is a new value).
  std::string check_between(const std::vector<NodeRef>& covers, bool writes = true) const;
  // "" when removing `site`'s in-place write to `written` is unobservable
  // (write_observable) and the grad mode does not change between `written`'s
  // producer and `site` (an in-place op under no_grad keeps its input's
  // autograd history; the functional op would make a tensor with none).
  std::string check_removed_write(NodeRef site, ValueRef written) const;
  // The same three checks as refusals naming their rule (nullopt: passed).
  std::optional<Refusal> refusal(NodeRef site, const std::vector<ValueRef>& guarded) const;
  std::optional<Refusal> refusal_between(const std::vector<NodeRef>& covers,
                                         bool writes = true) const;
  std::optional<Refusal> refusal_removed_write(NodeRef site, ValueRef written) const;
  // The tensor whose storage `v` is.
  ValueRef storage_root(ValueRef v) const;
  // The tensors `n` may write in place: its schema's `(a!)` arguments (a
  // written list: its elements), or, for a node with no schema (a Python
  // callable, a higher-order op whose body memslim cannot see), every tensor
  // it is given.
  std::vector<ValueRef> may_write(NodeRef n) const;

 private:
  const GraphView& g_;
  std::vector<NodeRef> order_;
};

} // namespace memslim
