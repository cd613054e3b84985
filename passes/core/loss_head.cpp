//===- loss_head.cpp - cross_entropy(linear(h, W)) without the logits ------===//
//
// Finds, prices and decides one loss head (see loss_head.h).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/loss_head.h"

#include <algorithm>
#include <sstream>

#include "memslim/core/output_saving.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {

// A head's linear whose logits others read too becomes this (linear_ops.cpp):
// aten's linear whose backward skips an undefined or all-zero gradient.
constexpr const char* kHeadLinear = "memslim::linear";

// The head as matched: linear -> [to(dtype)] -> [view to 2-D] -> cross_entropy.
struct Head {
  NodeRef linear;
  std::vector<NodeRef> chain; // linear first, cross_entropy last
  std::optional<c10::ScalarType> logits_dtype;
  std::string why_not; // set: not a head memslim takes
};

bool is_cast(const GraphView& g, NodeRef n) {
  const std::string k = g.kind(n);
  return k == "aten::to" || k == "aten::_to_copy";
}

bool is_flatten_view(const GraphView& g, NodeRef n) {
  const std::string k = g.kind(n);
  return k == "aten::view" || k == "aten::reshape" || k == "aten::_unsafe_view" ||
         k == "aten::contiguous";
}

// Walks from cross_entropy's input up to the linear.
Head match_head(const GraphView& g, NodeRef ce) {
  Head h;
  h.chain.push_back(ce);
  ValueRef x = g.input(ce, 0);
  const auto rank2 = g.rank(x);
  if (rank2 && *rank2 != 2) {
    h.why_not = "its logits have " + std::to_string(*rank2) +
                " dimensions (classes in dimension 1 of a 2-D input only)";
    return h;
  }
  for (int steps = 0; steps < 6; ++steps) {
    const NodeRef p = g.producer(x);
    if (!p || g.is_input(x)) break;
    if (g.owner(p) != g.owner(ce)) break;
    // memslim::linear: a head whose linear an earlier site of this pass took
    if ((g.kind(p) == "aten::linear" || g.kind(p) == kHeadLinear) && g.num_inputs(p) == 3) {
      h.linear = p;
      h.chain.push_back(p);
      std::reverse(h.chain.begin(), h.chain.end());
      return h;
    }
    if (is_cast(g, p)) {
      const auto in = g.dtype(g.input(p, 0)), out = g.dtype(g.output(p, 0));
      const auto din = g.device(g.input(p, 0)), dout = g.device(g.output(p, 0));
      if (!in || !out || !at::isFloatingType(*out) || din != dout) break;
      if (*in != *out && !h.logits_dtype) h.logits_dtype = *out;
    } else if (is_flatten_view(g, p)) {
      const auto in = g.sizes(g.input(p, 0)), out = g.sizes(g.output(p, 0));
      if (!in || !out || in->empty() || out->empty() || in->back() != out->back()) {
        h.why_not = "a view that does not only flatten the tokens sits between";
        return h;
      }
    } else {
      break;
    }
    h.chain.push_back(p);
    x = g.input(p, 0);
  }
  h.why_not = "its logits are not an aten::linear's (through a cast and a view)";
  return h;
}

FormulaArg value_arg(ValueRef v) { return {v, std::nullopt, ""}; }
FormulaArg const_arg(c10::IValue c, const std::string& name) { return {{}, std::move(c), name}; }

// Readers of the chain's values outside the chain, named for the remark.
std::string other_readers(const GraphView& g, const Head& h) {
  std::string who;
  for (size_t i = 0; i + 1 < h.chain.size(); ++i)
    for (size_t o = 0; o < g.num_outputs(h.chain[i]); ++o)
      for (const Use& u : g.uses(g.output(h.chain[i], o))) {
        if (u.user == h.chain[i + 1] || g.kind(u.user) == "aten::_assert_tensor_metadata") continue;
        if (who.empty())
          who = g.kind(u.user) == "prim::Return" ? "the graph's output" : g.kind(u.user);
      }
  return who;
}

// Whether `n` runs inside an enabled torch.autocast region (a graph traced
// above autocast: _enter_autocast / _exit_autocast markers around plain aten
// ops, whose values read as float32): the innermost region's `enabled` and
// dtype arguments, where constants, decide; an unreadable one counts as 16-bit.
bool under_autocast(const GraphView& g, NodeRef n) {
  std::vector<NodeRef> open;
  for (NodeRef m : g.nodes()) {
    if (m == n) break;
    const std::string k = g.kind(m);
    if (k == "python::_enter_autocast") open.push_back(m);
    if (k == "python::_exit_autocast" && !open.empty()) open.pop_back();
  }
  if (open.empty()) return false;
  const NodeRef e = open.back();
  if (g.num_inputs(e) > 2) {
    const auto on = g.constant(g.input(e, 2));
    if (on && on->isBool() && !on->toBool()) return false;
  }
  if (g.num_inputs(e) > 1) {
    const auto dt = g.constant(g.input(e, 1));
    if (dt && dt->isInt()) {
      const auto t = static_cast<c10::ScalarType>(dt->toInt());
      return t == at::kBFloat16 || t == at::kHalf;
    }
  }
  return true;
}

// The remark's last clause: which form of the op the site got.
std::string form_text(const std::string& readers) {
  if (readers.empty())
    return "; form: computes its own logits chunk by chunk (nothing else reads them)";
  return "; form: reads the logits it returns to " + readers +
         " (the linear becomes memslim::linear, whose backward skips an unused logits' zero "
         "gradient)";
}

} // namespace

bool is_loss_head_site(const GraphView& g, NodeRef n) {
  return g.kind(n) == "aten::cross_entropy_loss" && g.num_inputs(n) == 6 && g.num_outputs(n) == 1 &&
         g.is_tensor(g.input(n, 0));
}

FormulaDecision decide_loss_head(const GraphView& g, NodeRef n, const CostPolicy& policy) {
  FormulaDecision out;
  Decision& d = out.decision;
  d.pass = kLossHeadPass;
  d.site = site_name(g, n);
  d.verdict = Decision::Verdict::Kept;
  const auto weight = g.constant(g.input(n, 2));
  if (!weight || !weight->isNone()) {
    d.text = "it has class weights (not taken yet)";
    return out;
  }
  const auto reduction = g.constant(g.input(n, 3)), ignore = g.constant(g.input(n, 4)),
             smoothing = g.constant(g.input(n, 5));
  if (!reduction || !reduction->isInt() || !ignore || !ignore->isInt() || !smoothing ||
      !(smoothing->isDouble() || smoothing->isInt())) {
    d.text = "its reduction, ignore_index or label_smoothing is not a constant";
    return out;
  }
  const ValueRef target = g.input(n, 1);
  const auto tdt = g.dtype(target);
  if (!tdt || at::isFloatingType(*tdt) || at::isComplexType(*tdt)) {
    d.text = tdt ? "its targets are class probabilities (class indices only)"
                 : "its targets' dtype is unknown (give input shapes)";
    return out;
  }
  const Head head = match_head(g, n);
  if (!head.why_not.empty()) {
    d.text = head.why_not;
    return out;
  }
  const ValueRef h = g.input(head.linear, 0), w = g.input(head.linear, 1),
                 b = g.input(head.linear, 2);
  const ValueRef logits = g.input(n, 0);
  const auto lb = g.bytes(logits), hb = g.bytes(h), wb = g.bytes(w), ln = g.numel(logits);
  const auto lr = g.rank(w);
  if (!lb || !hb || !wb || !ln || !lr || *lr != 2) {
    d.text = "unknown shape (give input shapes)";
    return out;
  }
  const auto target_n = g.numel(target);
  if (!target_n) {
    d.text = "unknown shape (give input shapes)";
    return out;
  }
  const int64_t rows = *target_n;
  // 16-bit logits: the op accumulates the weight's gradient in float32 (aten's
  // mm does, and rounds once) beside its 16-bit copy, with float32 matmuls for
  // it: measured, its step peaked at 1.00-1.19x Inductor's at 1.4-1.6x its time.
  auto zdt = g.dtype(g.output(head.linear, 0));
  if (under_autocast(g, head.linear)) zdt = at::kBFloat16; // autocast's lower precision
  if (zdt && (*zdt == at::kBFloat16 || *zdt == at::kHalf)) {
    d.text = std::string("its logits come from a 16-bit matmul (") +
             (under_autocast(g, head.linear) ? "autocast" : c10::toString(*zdt)) +
             "): the op's float32 accumulation of the weight's gradient peaked at "
             "1.00-1.19x Inductor's step at 1.4-1.6x its time (bf16 autocast, vocab 32,000 "
             "and 128,256, bench/results/loss_head_2026-11-29b.md)";
    return out;
  }
  const std::string readers = other_readers(g, head);
  // aten keeps log_softmax's output, and the linear keeps h (unless another
  // node does); the op keeps the gradients (a scalar loss, when smaller than
  // the logits) or h, the targets and one float per row.
  std::string h_by;
  const bool h_else = saved::kept_by_other(g, h, {head.chain.begin(), head.chain.end()}, &h_by);
  const int64_t tb = rows * 8, lse = rows * 4;
  const int64_t aten = *lb + (h_else ? 0 : *hb) + tb;
  const bool scalar = reduction->toInt() != 0;
  const bool grads = scalar && *hb + *wb <= *lb;
  // The linear staying for another reader keeps h for its own backward.
  const bool h_kept = h_else || !readers.empty();
  const int64_t ours =
      grads ? *hb + *wb + (h_kept && !h_else ? *hb : 0) : (h_else ? 0 : *hb) + tb + lse;
  // Logits others read (the graph returns them): the op reads the linear's
  // output in place of its own forward matmul, and the linear becomes
  // memslim::linear, whose backward sees only the other readers' gradient
  // (skipped when undefined or all zero): the head's three matmuls, as aten's.
  // The recomputing form adds its backward's matmul, as without readers.
  const bool given = !readers.empty();
  d.price = {aten, ours, given && !grads ? 1.0 : 0.0};
  const int64_t freed = aten - ours;
  std::ostringstream why;
  if (freed < policy.min_bytes || freed <= 0) {
    why << "frees " << freed << " B, below the " << policy.min_bytes << " B minimum (" << aten
        << " -> " << ours << ")";
    d.text = why.str();
    return out;
  }
  why << "rewrote aten::cross_entropy_loss at " << g.name(g.output(n, 0))
      << ": linear + cross_entropy a chunk of tokens at a time "
         "(memslim::linear_cross_entropy), keeping "
      << (grads ? "the input's and weight's gradients (computed in forward)"
                : "the input, targets and log-sum-exp (backward recomputes the logits)")
      << " instead of log_softmax's output, frees " << freed << " B (" << aten << " -> " << ours
      << ")";
  d.text = why.str() + form_text(readers);
  d.verdict = Decision::Verdict::Rewrote;
  out.op = "memslim::linear_cross_entropy";
  out.args = {value_arg(h),
              value_arg(w),
              value_arg(b),
              value_arg(target),
              const_arg(*reduction, "reduction"),
              const_arg(*ignore, "ignore_index"),
              const_arg(c10::IValue(smoothing->toScalar().toDouble()), "label_smoothing"),
              const_arg(head.logits_dtype ? c10::IValue(static_cast<int64_t>(*head.logits_dtype))
                                          : c10::IValue(),
                        head.logits_dtype ? "logits_dtype" : "None"),
              const_arg(c10::IValue(int64_t{0}), "chunk"),
              const_arg(c10::IValue(grads), "grads_in_forward")};
  // logits: every argument explicit (TorchScript matches a node's schema by its inputs)
  out.args.push_back(given ? value_arg(g.output(head.linear, 0))
                           : const_arg(c10::IValue(), "None"));
  if (given && g.kind(head.linear) != kHeadLinear) out.swaps.push_back({head.linear, kHeadLinear});
  out.covers = head.chain;
  out.guarded = {h, w, target, logits, g.output(n, 0)};
  if (!g.constant(b)) out.guarded.push_back(b);
  return out;
}

} // namespace memslim
