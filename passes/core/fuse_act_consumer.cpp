//===- fuse_act_consumer.cpp - linear/conv(act(h)) keeps h, any view -------===//
//
// Finds, prices and decides one activation site (see fuse_act_consumer.h).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/fuse_act_consumer.h"

#include <sstream>

#include "memslim/core/activation_table.h"
#include "memslim/core/fuse_dropout.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/output_saving_norms.h"
#include "memslim/core/residual_join.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {

// The fused op for consumer `c` of value `a` (read as its input 0 only), or "".
std::string fused_kind_of(const GraphView& g, const Use& use, ValueRef a) {
  if (use.index != 0) return "";
  const NodeRef c = use.user;
  const std::string k = g.kind(c);
  for (size_t i = 1; i < g.num_inputs(c); ++i)
    if (g.input(c, i) == a) return ""; // also its weight or bias
  if (g.num_outputs(c) != 1) return "";
#define MEMSLIM_CONSUMER(NAME, ARGS, SPATIAL)                                    \
  if (k == "aten::" #NAME) {                                                     \
    /* the int-list padding form only (conv2d.padding takes "same" / "valid") */ \
    if (SPATIAL > 0 && g.num_inputs(c) > 4) {                                    \
      const auto pad = g.constant(g.input(c, 4));                                \
      if (pad && pad->isString()) return "";                                     \
    }                                                                            \
    return "memslim::act_" #NAME;                                                \
  }
#include "memslim/kernels/consumer_table.def"
  return "";
}

// A reader that keeps nothing of the value it reads as input `u.index`, holds
// no view of it and does not write it.
bool keeps_nothing_of(const GraphView& g, const Use& u) {
  const std::string k = g.kind(u.user);
  if (k == "prim::Return" || k.rfind("prim::", 0) == 0) return false;
  if (saved::keeps_input(g, u.user, u.index) || saved::is_view_of_input(g, u.user, u.index))
    return false;
  const c10::FunctionSchema* s = g.schema(u.user);
  if (!s || u.index >= s->arguments().size()) return false;
  const c10::AliasInfo* ai = s->arguments()[u.index].alias_info();
  return !(ai && ai->isWrite());
}

// The readers of the activation's output `act_out`, each with the value it reads,
// looking through dropouts that return their input (p = 0 or not training: ViT's
// MLP dropout at p = 0), which go with the rewrite (into out.passed).
std::vector<std::pair<Use, ValueRef>> readers_of(const GraphView& g, NodeRef a, ValueRef act_out,
                                                 ActConsumerDecision& out) {
  std::vector<std::pair<Use, ValueRef>> uses;
  std::vector<ValueRef> todo{act_out};
  while (!todo.empty()) {
    const ValueRef v = todo.back();
    todo.pop_back();
    for (const Use& u : g.uses(v)) {
      if (u.index == 0 && saved::is_dropout_kind(g.kind(u.user), /*inplace=*/false) &&
          g.num_outputs(u.user) == 1 && saved::dropout_is_identity(g, u.user) &&
          g.owner(u.user) == g.owner(a)) {
        out.passed.push_back(u.user);
        todo.push_back(g.output(u.user, 0));
        continue;
      }
      uses.push_back({u, v});
    }
  }
  return uses;
}

// The readers sorted into consumers (out.consumers / fused_kind) and readers that
// keep nothing of the output (ResNet's identity add), which may stay: the activation
// then stays for them (`others`, the last one's kind in `other_kind`). Returns why
// the site is kept, or "".
std::string sort_readers(const GraphView& g, NodeRef a, ValueRef act_out,
                         const std::vector<std::pair<Use, ValueRef>>& uses,
                         ActConsumerDecision& out, std::vector<Use>& others,
                         std::string& other_kind) {
  for (const auto& [u, read] : uses) {
    if (g.owner(u.user) != g.owner(a)) return "a reader sits in another block";
    const std::string k = fused_kind_of(g, u, read);
    if (k.empty()) {
      if (read != act_out || !keeps_nothing_of(g, u))
        return "its output is read by " + g.kind(u.user) +
               " (only linear / conv inputs take the activation in)";
      others.push_back(u);
      other_kind = g.kind(u.user);
      continue;
    }
    out.consumers.push_back(u.user);
    out.fused_kind.push_back(k);
  }
  if (out.consumers.empty())
    return "its output is read by " + other_kind +
           " (only linear / conv inputs take the activation in)";
  return "";
}

// The activation staying for the other readers: what it adds to what the rewrite
// keeps (`ours`), the bytes a later pass frees of it (`bonus`), and the text.
struct Stays {
  std::string text;
  int64_t ours = 0, bonus = 0;
};

// Keeping its input costs nothing more; keeping its output costs it, unless a
// residual join takes the activation in (fuse-residual-join, next) or
// output-saving then keeps a 1-bit mask (relu).
// Until then it keeps what aten's keeps (its output, for relu / sigmoid /
// tanh: priced here); the residual join (next) may take it in, or
// output-saving turn it into a 1-bit mask: their bytes, counted in their own
// records, make the decision here (as the norm's below) but not its price.
Stays stays_for(const GraphView& g, const ActivationInfo& info, const std::vector<Use>& others,
                const std::string& other_kind, ValueRef act_out, int64_t ab) {
  Stays s;
  if (!others.empty() && info.aten_keeps == Keeps::Input) {
    s.text = "; it stays for " + other_kind + " keeping its input";
  } else if (!others.empty()) {
    s.ours = ab;
    const bool joined = others.size() == 1 && join_would_take(g, others[0].user, act_out);
    if (joined) {
      s.bonus = ab;
      s.text = "; it stays for the residual join at " + g.name(g.output(others[0].user, 0)) +
               ", which takes it in then (" + std::to_string(s.bonus) + " B more)";
    } else if (info.memslim_keeps == Keeps::Bits) {
      s.bonus = ab - (*g.numel(act_out) + 7) / 8;
      s.text = "; it stays for " + other_kind + ", where output-saving then keeps a 1-bit mask (" +
               std::to_string(s.bonus) + " B more)";
    } else {
      s.text = "; it stays for " + other_kind + " keeping its output";
    }
  }
  return s;
}

// A norm made h and nothing else reads it: output-saving-norms will keep h
// for it instead of its input (priced here, decided and rewritten there).
// Returns the bytes that frees and the text (`chain`).
int64_t norm_freed_by(const GraphView& g, ValueRef h, bool h_else, std::string& chain) {
  int64_t norm_freed = 0;
  const NodeRef n = g.producer(h);
  if (n && !h_else && is_norm_site(g, n) && g.uses(h).size() == 1) {
    norm_freed = norm_output_saving_frees(g, n);
    if (norm_freed > 0) chain = "; " + g.kind(n) + " at " + g.name(h) + " keeping its output then";
  } else if (n && !h_else && g.uses(h).size() == 1) {
    // h is a residual join's sum (ResNet's block output): fuse-residual-join
    // will keep it instead of the norm's input.
    if (const NodeRef jn = join_norm(g, n)) {
      norm_freed = norm_output_saving_frees(g, jn);
      if (norm_freed > 0) chain = "; the residual join at " + g.name(h) + " keeping it then";
    }
  }
  return norm_freed;
}

} // namespace

bool is_act_consumer_site(const GraphView& g, NodeRef a) {
  auto info = activation_info(c10::Symbol::fromQualString(g.kind(a)));
  return info && g.kind(a) == info->aten.toQualString() && g.num_inputs(a) > 0 &&
         g.num_outputs(a) == 1 && g.is_tensor(g.input(a, 0));
}

ActConsumerDecision decide_act_consumer(const GraphView& g, NodeRef a, const CostPolicy& policy) {
  const ActivationInfo info = *activation_info(c10::Symbol::fromQualString(g.kind(a)));
  ActConsumerDecision out;
  Decision& d = out.decision;
  d.pass = kFuseActConsumerPass;
  d.site = site_name(g, a);
  d.verdict = Decision::Verdict::Kept;
  out.h = g.input(a, 0);
  const ValueRef act_out = g.output(a, 0);
  auto hb = g.bytes(out.h), ab = g.bytes(act_out);
  if (!hb || !ab) {
    d.text = "unknown shape (give input shapes)";
    return out;
  }
  const std::vector<std::pair<Use, ValueRef>> uses = readers_of(g, a, act_out, out);
  if (uses.empty()) {
    d.text = "its output is not read";
    return out;
  }
  std::vector<Use> others;
  std::string other_kind;
  d.text = sort_readers(g, a, act_out, uses, out, others, other_kind);
  if (!d.text.empty()) return out;
  auto spec = activation_spec_of(g, a);
  if (!spec) {
    d.text = "its arguments are not constants";
    return out;
  }
  // Backward evaluates the activation once more per element; the forward
  // once more too where the activation stays for other readers.
  const double kWork = others.empty() ? 1.0 : 2.0;
  if (policy.max_added_work >= 0 && kWork > policy.max_added_work) {
    std::ostringstream why;
    why << "adds ~" << kWork << " evaluation per element in backward, above the maximum "
        << policy.max_added_work;
    d.text = why.str();
    d.price = {std::nullopt, std::nullopt, kWork};
    return out;
  }
  out.spec = *spec;
  out.guarded = {out.h, act_out};
  for (NodeRef c : out.consumers)
    for (size_t i = 1; i < g.num_inputs(c) && i < 3; ++i)
      if (g.is_tensor(g.input(c, i))) out.guarded.push_back(g.input(c, i));
  saved::NodeSet self{a};
  for (NodeRef c : out.consumers) self.insert(c);
  for (NodeRef p : out.passed) self.insert(p);
  std::string h_by;
  const bool h_else = saved::kept_by_other(g, out.h, self, &h_by);
  // What aten keeps: act(h) in the consumers (and in the activation when it
  // keeps its output), h in the activation when it keeps its input.
  const int64_t aten = *ab + (info.aten_keeps == Keeps::Input && !h_else ? *hb : 0);
  int64_t ours = h_else ? 0 : *hb;
  const Stays stays = stays_for(g, info, others, other_kind, act_out, *ab);
  ours += stays.ours;
  std::string chain;
  const int64_t norm_freed = norm_freed_by(g, out.h, h_else, chain);
  // The price carries this rewrite's own bytes; the norm's are its own
  // decision's (predicted_bytes_freed sums the records).
  const int64_t freed = aten - ours + norm_freed + stays.bonus;
  d.price = {aten, ours, kWork};
  std::ostringstream why;
  if (freed < policy.min_bytes || freed <= 0) {
    why << "frees " << freed << " B (keeps " << g.name(out.h) << " instead of " << g.name(act_out)
        << (h_else ? "" : ", kept by nobody today") << ")";
    d.text = why.str();
    return out;
  }
  why << "fused " << g.kind(a) << " at " << g.name(act_out) << " into " << out.consumers.size()
      << " consumer" << (out.consumers.size() > 1 ? "s" : "") << " (" << out.fused_kind.front()
      << "): keeps its input instead of its output, frees " << (aten - ours) << " B (" << aten
      << " -> " << ours << ")";
  if (!chain.empty()) why << chain << " frees " << norm_freed << " B more";
  why << stays.text;
  d.verdict = Decision::Verdict::Rewrote;
  d.text = why.str();
  return out;
}

} // namespace memslim
