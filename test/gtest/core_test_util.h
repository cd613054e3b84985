//===- core_test_util.h - a small FX-like graph builder for the core tests ===//
//
// What: Builder (an FxGraphView of fp32 tensors, constants, ops, inputs and return) and
// node_named, what core_test.cpp and core_cutout_test.cpp build their graphs with.
// Why: one copy of the helpers for the core's two test files.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memslim/fx/fx_graph_view.h"

namespace core_test {

using memslim::FxGraphView;

// A small FX-like graph builder: tensors of n fp32 elements, constants.
struct Builder {
  FxGraphView g;
  std::vector<size_t> params;
  std::optional<c10::DeviceType> device; // of every tensor it makes
  size_t tensor(const std::string& name, int64_t n = 64) {
    FxGraphView::Value v;
    v.name = name;
    v.tensor = true;
    v.numel = n;
    v.dtype = at::kFloat;
    v.device = device;
    return g.add_value(v);
  }
  size_t constant(c10::IValue c) {
    FxGraphView::Value v;
    v.name = "c";
    v.constant = std::move(c);
    return g.add_value(v);
  }
  size_t none() { return constant(c10::IValue()); }
  size_t op(const std::string& kind, const std::string& overload, std::vector<size_t> in,
            const std::string& out, int64_t n = 64) {
    const size_t o = tensor(out, n);
    g.add_node(kind, overload, in, {o});
    return o;
  }
  void inputs(std::vector<size_t> vs) { g.add_node("prim::Param", std::nullopt, {}, vs); }
  void ret(std::vector<size_t> vs) { g.add_node("prim::Return", std::nullopt, vs, {}); }
};

inline memslim::NodeRef node_named(const FxGraphView& g, const std::string& kind) {
  for (auto n : g.nodes())
    if (g.kind(n) == kind) return n;
  return {};
}

} // namespace core_test
