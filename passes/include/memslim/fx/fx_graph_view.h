//===- fx_graph_view.h - an aten-level FX graph as the core's GraphView ----===//
//
// What: the FX front end's GraphView, built node by node from an aten-level
// FX graph (torch.export's training IR, the graph torch.compile's backend
// traces, any GraphModule with `meta["val"]`): python/memslim/fx.py hands over
// each node's op (schema name and overload), input values and output values
// with the facts of their FakeTensors (elements, dtype). Placeholders are the
// outputs of one "prim::Param" node, get_attr constants "prim::GetAttr" nodes
// where they stand, list arguments "prim::ListConstruct" nodes, the graph's
// output one "prim::Return" node.
// A decision that rewrites a node sets its op and arguments (rewrite_node,
// erase_node; a region: insert_node_before, move_uses), so the decisions
// after it see the graph as it will be.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <deque>

#include "memslim/core/graph_view.h"

namespace memslim {

class FxGraphView final : public GraphView {
 public:
  struct Value {
    size_t id = 0;
    int producer = -1; // node id
    size_t offset = 0;
    bool tensor = false;
    std::optional<int64_t> numel;
    std::optional<c10::ScalarType> dtype;
    std::optional<c10::DeviceType> device;
    std::optional<bool> requires_grad;         // known: a buffer, a value made under no_grad
    bool module_state = false;                 // a parameter or buffer placeholder
    std::optional<int64_t> rank;               // number of dimensions
    std::optional<bool> contiguous;            // row-major
    std::optional<std::vector<int64_t>> sizes; // every size known (hints)
    std::optional<c10::IValue> constant;
    std::string name;
    std::vector<Use> uses;
  };
  struct Node {
    size_t id = 0;
    std::string kind;
    const c10::FunctionSchema* schema = nullptr; // the registered op's (dispatcher-owned)
    std::vector<size_t> inputs, outputs;         // value ids
    bool erased = false;
  };

  // Builders: a value, then the node producing it (inputs must exist).
  size_t add_value(Value v);
  // `kind`/`overload`: "aten::gelu"/"" looks the schema up in the dispatcher;
  // no overload: a node without a registered op (prims; Python callables,
  // which the rules treat as unknown ops). Throws std::invalid_argument for an
  // op the dispatcher does not know or a bad value id.
  size_t add_node(const std::string& kind, const std::optional<std::string>& overload,
                  const std::vector<size_t>& inputs, const std::vector<size_t>& outputs);
  // A rewrite that changes a node's op and arguments (`kind`/`overload` as
  // add_node's): its uses move from the old inputs to the new ones.
  void rewrite_node(size_t node, const std::string& kind, const std::string& overload,
                    const std::vector<size_t>& inputs);
  // A node a rewrite left without readers: gone from nodes() and from its
  // inputs' uses (its outputs must have no uses).
  void erase_node(size_t node);
  // A new node placed just before node `before` in nodes() (a rewrite's new
  // op: recompute-pointwise-regions' op goes before the region's first
  // consumer); as add_node otherwise.
  size_t insert_node_before(size_t before, const std::string& kind,
                            const std::optional<std::string>& overload,
                            const std::vector<size_t>& inputs, const std::vector<size_t>& outputs);
  // Uses of value `from` by nodes other than `except` read value `to` instead.
  void move_uses(size_t from, size_t to, const std::vector<size_t>& except);
  size_t id(NodeRef n) const { return static_cast<const Node*>(n.p)->id; }
  // Whether a rewrite erased node `n` (it is then out of nodes()).
  bool erased(NodeRef n) const { return static_cast<const Node*>(n.p)->erased; }
  size_t id(ValueRef v) const { return static_cast<const Value*>(v.p)->id; }
  NodeRef node_ref(size_t id) const { return NodeRef{&nodes_.at(id)}; }
  ValueRef value_ref(size_t id) const { return ValueRef{&values_.at(id)}; }

  Autograd autograd() const override { return Autograd::Eager; }
  std::vector<NodeRef> nodes() const override;
  std::string kind(NodeRef n) const override { return N(n).kind; }
  const c10::FunctionSchema* schema(NodeRef n) const override { return N(n).schema; }
  size_t num_inputs(NodeRef n) const override { return N(n).inputs.size(); }
  ValueRef input(NodeRef n, size_t i) const override { return value_ref(N(n).inputs.at(i)); }
  size_t num_outputs(NodeRef n) const override { return N(n).outputs.size(); }
  ValueRef output(NodeRef n, size_t i) const override { return value_ref(N(n).outputs.at(i)); }
  NodeRef owner(NodeRef) const override { return NodeRef{}; } // no blocks in FX graphs
  bool differentiable(NodeRef) const override { return true; }
  NodeRef producer(ValueRef v) const override {
    return V(v).producer < 0 ? NodeRef{} : node_ref(size_t(V(v).producer));
  }
  size_t offset(ValueRef v) const override { return V(v).offset; }
  std::vector<Use> uses(ValueRef v) const override { return V(v).uses; }
  bool is_tensor(ValueRef v) const override { return V(v).tensor; }
  std::optional<c10::IValue> constant(ValueRef v) const override { return V(v).constant; }
  std::optional<int64_t> numel(ValueRef v) const override { return V(v).numel; }
  std::optional<c10::ScalarType> dtype(ValueRef v) const override { return V(v).dtype; }
  std::optional<c10::DeviceType> device(ValueRef v) const override { return V(v).device; }
  std::string name(ValueRef v) const override { return "%" + V(v).name; }
  std::optional<bool> requires_grad(ValueRef v) const override { return V(v).requires_grad; }
  bool module_state(ValueRef v) const override { return V(v).module_state; }
  std::optional<int64_t> rank(ValueRef v) const override { return V(v).rank; }
  std::optional<bool> contiguous(ValueRef v) const override { return V(v).contiguous; }
  std::optional<std::vector<int64_t>> sizes(ValueRef v) const override { return V(v).sizes; }

 private:
  static const Node& N(NodeRef n) { return *static_cast<const Node*>(n.p); }
  static const Value& V(ValueRef v) { return *static_cast<const Value*>(v.p); }
  std::deque<Node> nodes_;    // deque: handles stay valid while building
  std::vector<size_t> order_; // node ids in program order
  std::deque<Value> values_;
};

} // namespace memslim
