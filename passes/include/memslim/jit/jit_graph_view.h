//===- jit_graph_view.h - a TorchScript graph as the core's GraphView ------===//
//
// What: the TorchScript front end's GraphView: a live view of a
// torch::jit::Graph (no copy, so a rewrite the passes make is seen at once).
// Handles are the jit Node* / Value* themselves.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

#include "memslim/core/graph_view.h"

namespace memslim {

class JitGraphView final : public GraphView {
 public:
  // `graph` is needed by nodes() only; node- and value-level queries work
  // without one.
  explicit JitGraphView(std::shared_ptr<torch::jit::Graph> graph = nullptr)
      : graph_(std::move(graph)) {}

  static NodeRef ref(const torch::jit::Node* n) { return NodeRef{n}; }
  static ValueRef ref(const torch::jit::Value* v) { return ValueRef{v}; }
  static torch::jit::Node* node(NodeRef n) {
    return const_cast<torch::jit::Node*>(static_cast<const torch::jit::Node*>(n.p));
  }
  static torch::jit::Value* value(ValueRef v) {
    return const_cast<torch::jit::Value*>(static_cast<const torch::jit::Value*>(v.p));
  }

  Autograd autograd() const override { return Autograd::TorchScript; }
  std::vector<NodeRef> nodes() const override;
  std::string kind(NodeRef n) const override;
  const c10::FunctionSchema* schema(NodeRef n) const override;
  size_t num_inputs(NodeRef n) const override;
  ValueRef input(NodeRef n, size_t i) const override;
  size_t num_outputs(NodeRef n) const override;
  ValueRef output(NodeRef n, size_t i) const override;
  NodeRef owner(NodeRef n) const override;
  bool differentiable(NodeRef n) const override;
  NodeRef producer(ValueRef v) const override;
  size_t offset(ValueRef v) const override;
  std::vector<Use> uses(ValueRef v) const override;
  bool is_tensor(ValueRef v) const override;
  std::optional<c10::IValue> constant(ValueRef v) const override;
  std::optional<int64_t> numel(ValueRef v) const override;
  std::optional<c10::ScalarType> dtype(ValueRef v) const override;
  std::optional<int64_t> rank(ValueRef v) const override;
  std::optional<std::vector<int64_t>> sizes(ValueRef v) const override;
  std::optional<bool> contiguous(ValueRef v) const override;
  std::optional<c10::DeviceType> device(ValueRef v) const override;
  std::string name(ValueRef v) const override;
  // Constants: false; attributes: a parameter slot of the module's class true,
  // a buffer false.
  std::optional<bool> requires_grad(ValueRef v) const override;

 private:
  std::shared_ptr<torch::jit::Graph> graph_;
};

} // namespace memslim
