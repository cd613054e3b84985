//===- fuse_dropout.cpp - dropout(act(x)) -> one memslim op, any view ------===//
#include "memslim/core/fuse_dropout.h"

#include <algorithm>
#include <sstream>

#include "memslim/core/activation_table.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {
std::optional<ActivationInfo> aten_activation(const GraphView& g, NodeRef n) {
  auto info = activation_info(c10::Symbol::fromQualString(g.kind(n)));
  if (!info || g.kind(n) != info->aten.toQualString()) return std::nullopt;
  return info;
}

} // namespace

// The kernel activation and parameters of activation `a` when its arguments
// are constants (activation_dropout takes them as constants): the runtime's
// own spec functions, so celu/selu/gelu map exactly as the ops do.
std::optional<ActSpec> activation_spec_of(const GraphView& g, NodeRef a) {
  std::vector<c10::IValue> args;
  for (size_t i = 1; i < g.num_inputs(a); ++i) {
    auto iv = g.constant(g.input(a, i));
    if (!iv) return std::nullopt;
    args.push_back(*iv);
  }
  try {
    return spec_for(c10::Symbol::fromQualString(g.kind(a)).toUnqualString(), args);
  } catch (const c10::Error&) {
    return std::nullopt; // e.g. celu(alpha=0): left to aten's own error
  }
}

bool is_fuse_dropout_site(const GraphView& g, NodeRef d) {
  if (g.kind(d) != "aten::dropout" || g.num_inputs(d) < 3 || g.num_outputs(d) != 1) return false;
  const NodeRef a = g.producer(g.input(d, 0));
  if (!a || g.num_outputs(a) != 1) return false;
  auto info = aten_activation(g, a);
  return info && info->memslim_keeps != Keeps::Bits;
}

FuseDropoutDecision decide_fuse_dropout(const GraphView& g, NodeRef d, const CostPolicy& policy) {
  FuseDropoutDecision out;
  const NodeRef a = g.producer(g.input(d, 0));
  out.act = a;
  out.x = g.input(a, 0);
  const ValueRef act_out = g.output(a, 0), y = g.output(d, 0);
  out.guarded[0] = out.x;
  out.guarded[1] = act_out;
  out.guarded[2] = y;
  Decision& dec = out.decision;
  dec.pass = kFuseDropoutPass;
  dec.site = site_name(g, a) + " + aten::dropout";
  dec.verdict = Decision::Verdict::Kept;
  if (g.uses(act_out).size() != 1) {
    dec.text = "the activation's output has other uses";
    return out;
  }
  if (saved::dropout_is_identity(g, d)) {
    // It keeps nothing: the activation's own rewrites (into its consumer, or
    // output-saving) see through it.
    dec.text = "the dropout returns its input (p = 0 or not training)";
    return out;
  }
  auto spec = activation_spec_of(g, a);
  if (!spec) {
    dec.text = "non-constant activation arguments";
    return out;
  }
  out.spec = *spec;
  const auto xb = g.bytes(out.x), ob = g.bytes(y);
  const auto n_el = g.numel(y);
  if (!xb || !ob || !n_el) {
    dec.text = "unknown shape (give input shapes)";
    return out;
  }
  const bool x_else = saved::kept_by_other(g, out.x, {a});
  const bool out_else = saved::kept_by_other(g, y, {d});
  // Unresolved (eager autograd, the FX front end): aten::dropout runs
  // native_dropout on CUDA (a bool mask), its own mul by float noise elsewhere.
  const int mask_bytes = policy.dropout_mask_bytes >= 0         ? policy.dropout_mask_bytes
                         : g.device(y) == c10::DeviceType::CUDA ? 1
                                                                : 0;
  const int64_t noise = mask_bytes > 0 ? *n_el * mask_bytes : *ob;
  const int64_t aten_keeps = (x_else ? 0 : *xb) + noise; // input + dropout's noise or mask
  const int64_t ours = (out_else ? 0 : *ob) + 2 * ((*n_el + 7) / 8);
  const int64_t freed = aten_keeps - ours;
  dec.price = Price{aten_keeps, ours, aten_activation(g, a)->added_work};
  if (freed < policy.min_bytes) {
    dec.text = "frees " + std::to_string(freed) + " B";
    return out;
  }
  std::ostringstream why;
  why << "rewrote " << g.kind(a) << " + aten::dropout at " << g.name(y)
      << ": keeps output + 2 bits instead of " << (x_else ? "" : "input + ")
      << (mask_bytes > 0 ? "dropout mask" : "dropout noise") << ", frees " << freed << " B ("
      << aten_keeps << " -> " << ours << ")";
  dec.verdict = Decision::Verdict::Rewrote;
  dec.text = why.str();
  return out;
}

int64_t next_dropout_instance(const GraphView& g) {
  int64_t next = 1;
  for (NodeRef n : g.nodes())
    if (g.kind(n) == kActivationDropout && g.num_inputs(n) > 5)
      if (auto v = g.constant(g.input(n, 5)); v && v->isInt())
        next = std::max(next, v->toInt() + 1);
  return next;
}

} // namespace memslim
