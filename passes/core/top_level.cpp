//===- top_level.cpp - a graph's top-level block, for cutting functions out ===//
//
// See top_level.h.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/top_level.h"

#include "memslim/core/saved_tensors.h"

namespace memslim {

bool replay_unsafe(const std::string& kind) {
  const std::string& k = kind;
  return k == "prim::Print" || k == "aten::warn" || k == "prim::SetAttr" ||
         k == "prim::CallMethod" || k == "prim::CallFunction" || k == "prim::PythonOp";
}

std::optional<int64_t> kept_bytes(const Top& t, const std::vector<NodeRef>& covers) {
  const GraphView& g = t.g;
  saved::NodeSet cover_set(covers.begin(), covers.end());
  std::unordered_set<NodeRef, NodeRefHash> all; // nested nodes too
  for (NodeRef n : g.nodes())
    if (cover_set.count(t.top_of(n))) all.insert(n);
  saved::NodeSet everything(all.begin(), all.end());
  ValueSet seen;
  int64_t total = 0;
  bool known = true;
  auto count = [&](ValueRef v) {
    if (!g.is_tensor(v) || !seen.insert(v.p).second) return;
    const NodeRef p = g.producer(v);
    if ((p && g.kind(p) == "prim::GetAttr") || g.module_state(v) || g.constant(v)) return;
    if (g.requires_grad(v) == std::optional<bool>(false) && g.is_input(v)) return;
    if (saved::kept_by_other(g, v, everything)) return;
    const auto b = g.bytes(v);
    if (!b) {
      known = false;
      return;
    }
    total += *b;
  };
  for (NodeRef n : all) {
    for (size_t i = 0; i < g.num_inputs(n); ++i)
      if (saved::keeps_input(g, n, i)) count(g.input(n, i));
    if (saved::keeps_output(g, n))
      for (size_t k = 0; k < g.num_outputs(n); ++k) count(g.output(n, k));
  }
  if (!known) return std::nullopt;
  return total;
}

} // namespace memslim
