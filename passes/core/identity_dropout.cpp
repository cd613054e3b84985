//===- identity_dropout.cpp - dropouts with p == 0, any view ----------------===//
//
// Finds and prices dropouts whose constant p is 0 (see identity_dropout.h).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/identity_dropout.h"

#include <sstream>

#include "memslim/core/output_saving.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

bool is_identity_dropout(const GraphView& g, NodeRef n) {
  return saved::is_dropout_kind(g.kind(n), /*inplace=*/false) && g.num_inputs(n) == 3 &&
         g.num_outputs(n) == 1 && g.is_tensor(g.input(n, 0)) && saved::dropout_is_identity(g, n);
}

Decision decide_identity_dropout(const GraphView& g, NodeRef n, const CostPolicy& policy) {
  Decision d;
  d.pass = kIdentityDropoutPass;
  d.site = site_name(g, n);
  d.verdict = Decision::Verdict::Rewrote;
  const ValueRef in = g.input(n, 0), out = g.output(n, 0);
  const auto numel = g.numel(out);
  const int mask = policy.dropout_mask_bytes > 0 ? policy.dropout_mask_bytes : 0;
  // Where TorchScript's autodiff runs the dropout (mask > 0) its output is a
  // tensor of its own: a reader keeping it keeps a second copy of the input
  // when something else keeps the input too. Removed, that copy goes as well.
  const saved::NodeSet self{n};
  const bool copy =
      mask > 0 && saved::kept_by_other(g, out, self) && saved::kept_by_other(g, in, self);
  const int64_t copy_bytes = copy ? g.bytes(out).value_or(0) : 0;
  if (numel) d.price = {*numel * mask + copy_bytes, 0, 0.0};
  const auto p = g.constant(g.input(n, 1));
  const bool p_zero = p && p->isDouble() && p->toDouble() == 0.0;
  std::ostringstream why;
  why << "removed " << g.kind(n) << " at " << g.name(g.output(n, 0)) << ": "
      << (p_zero ? "p is 0" : "train is false") << ", so its output is its input";
  if (numel && mask > 0)
    why << " (frees the " << *numel * mask << " B mask TorchScript's autodiff keeps for it"
        << (copy_bytes ? " and a " + std::to_string(copy_bytes) + " B copy of its input" : "")
        << ")";
  d.text = why.str();
  return d;
}

} // namespace memslim
