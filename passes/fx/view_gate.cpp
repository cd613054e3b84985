//===- view_gate.cpp - the FX front end's safety gate, over a GraphView ----===//
//
// The checks of view_gate.h: each refusal names its rule (core/gate_rules.h);
// the check* forms return the reason alone ("" when the rewrite may go).
//
//===----------------------------------------------------------------------===//
#include "memslim/fx/view_gate.h"

#include <algorithm>

#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {
// A dropout may return its input (p == 0 or not training, unless its constants
// say otherwise): the same storage under another name.
bool may_return_input(const GraphView& g, NodeRef n) {
  return saved::is_dropout_kind(g.kind(n), /*inplace=*/false);
}
} // namespace

ValueRef ViewGate::storage_root(ValueRef v) const {
  for (int guard = 0; guard < 100000; ++guard) {
    const NodeRef p = g_.producer(v);
    if (!p || g_.is_input(v) || g_.num_inputs(p) == 0) return v;
    if (saved::may_alias_input(g_, p, 0) || may_return_input(g_, p) ||
        saved::returns_written_first(g_.schema(p))) {
      v = g_.input(p, 0);
      continue;
    }
    return v;
  }
  return v;
}

std::vector<ValueRef> ViewGate::may_write(NodeRef n) const {
  std::vector<ValueRef> out;
  // A tensor, or the elements of a list argument.
  auto add = [&](ValueRef v) {
    const NodeRef p = g_.producer(v);
    if (p && g_.kind(p) == "prim::ListConstruct") {
      for (size_t i = 0; i < g_.num_inputs(p); ++i)
        if (g_.is_tensor(g_.input(p, i))) out.push_back(g_.input(p, i));
    } else if (g_.is_tensor(v)) {
      out.push_back(v);
    }
  };
  const c10::FunctionSchema* s = g_.schema(n);
  if (!s) {
    if (g_.kind(n).rfind("prim::", 0) == 0) return out; // Param, ListConstruct, Return
    for (size_t i = 0; i < g_.num_inputs(n); ++i) add(g_.input(n, i));
    return out;
  }
  if (!s->is_mutable()) return out;
  for (size_t i = 0; i < s->arguments().size() && i < g_.num_inputs(n); ++i) {
    const c10::AliasInfo* a = s->arguments()[i].alias_info();
    if (a && a->isWrite()) add(g_.input(n, i));
  }
  return out;
}

namespace {
std::string reason_of(const std::optional<Refusal>& r) { return r ? r->reason : std::string(); }
} // namespace

std::string ViewGate::check(NodeRef site, const std::vector<ValueRef>& guarded) const {
  return reason_of(refusal(site, guarded));
}

std::string ViewGate::check_between(const std::vector<NodeRef>& covers, bool writes) const {
  return reason_of(refusal_between(covers, writes));
}

std::string ViewGate::check_removed_write(NodeRef site, ValueRef written) const {
  return reason_of(refusal_removed_write(site, written));
}

std::optional<Refusal> ViewGate::refusal(NodeRef site, const std::vector<ValueRef>& guarded) const {
  std::vector<ValueRef> roots;
  for (ValueRef v : guarded)
    if (v) roots.push_back(storage_root(v));
  bool after = false;
  for (NodeRef n : order_) {
    if (n == site) {
      after = true;
      continue;
    }
    if (!after) continue;
    for (ValueRef w : may_write(n)) {
      const ValueRef r = storage_root(w);
      for (ValueRef root : roots)
        if (r == root)
          return refuse(
              GateRule::WriteAfterGuarded,
              (g_.schema(n) ? "written in place afterwards by " + g_.kind(n)
                            : "handed afterwards to " + g_.kind(n) +
                                  " (no schema: memslim cannot see whether it writes it)") +
                  (g_.num_outputs(n) ? " at " + g_.name(g_.output(n, 0)) : std::string()));
    }
  }
  return std::nullopt;
}

std::optional<Refusal> ViewGate::refusal_between(const std::vector<NodeRef>& covers,
                                                 bool writes) const {
  auto covered = [&](NodeRef n) {
    return std::find(covers.begin(), covers.end(), n) != covers.end();
  };
  std::vector<ValueRef> read;
  for (NodeRef c : covers)
    for (size_t i = 0; i < g_.num_inputs(c); ++i)
      if (g_.is_tensor(g_.input(c, i))) read.push_back(storage_root(g_.input(c, i)));
  size_t left = covers.size();
  bool inside = false;
  for (NodeRef n : order_) {
    if (covered(n)) {
      inside = true;
      if (--left == 0) break;
      continue;
    }
    if (!inside) continue;
    if (switches_grad_mode(g_.kind(n)))
      return refuse(GateRule::GradModeBetween,
                    g_.kind(n) + " switches the grad mode between its nodes");
    if (!writes) continue;
    for (ValueRef w : may_write(n)) {
      const ValueRef r = storage_root(w);
      if (std::find(read.begin(), read.end(), r) != read.end())
        return refuse(GateRule::WriteBetween,
                      g_.kind(n) + (g_.schema(n) ? " writes " : " (no schema) may write ") +
                          g_.name(w) + " in place between its nodes");
    }
  }
  return std::nullopt;
}

std::optional<Refusal> ViewGate::refusal_removed_write(NodeRef site, ValueRef written) const {
  if (auto why = write_observable(g_, written)) return refuse(GateRule::ObservableWrite, *why);
  // An in-place op under no_grad leaves its input's autograd history in place
  // (gradients flow through it as if it were not there); the functional op
  // there makes a tensor with none, cutting the gradient (fuzz seed 927093:
  // `with no_grad: v.tanh_()` read afterwards). The TorchScript gate refuses
  // a prim::Enter / prim::Exit between the nodes in the same way.
  const NodeRef p = g_.producer(written);
  return p ? refusal_between({p, site}, /*writes=*/false) : std::nullopt;
}

} // namespace memslim
