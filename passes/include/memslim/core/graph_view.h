//===- graph_view.h - the graph facts memslim's decisions read --------------===//
//
// What: a small, read-only view of a training graph as the decision core sees
// it: nodes named by their op's schema ("aten::gelu"), their inputs and
// outputs, each value's uses, tensor facts (elements, dtype), constants, block
// membership (If branches, loop bodies) and which autograd differentiates it.
// Two implementations: JitGraphView (a live view of a torch::jit::Graph, no
// copy: the TorchScript front end) and FxGraphView (built from an aten-level
// FX graph's nodes and their `meta["val"]`: the torch.compile / torch.export
// front end).
// Why: the saved-tensor analysis, the prices and the decisions are written
// once over this view, so both front ends decide the same way from the same
// code; only reading a graph and applying a decision are per front end.
//
// Conventions both views follow:
// - A graph (or block) input is a value whose producer is null or a node of
//   kind "prim::Param".
// - A list argument (aten::cat's tensors) is one value made by a
//   "prim::ListConstruct" node whose inputs are the elements.
// - A block's results are the inputs of a "prim::Return" node whose owner()
//   is the If / Loop holding the block; top-level results: owner() is null.
// - Constants (Python scalars in FX, prim::Constant in TorchScript) are values
//   with constant() set.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memslim {

// Handles into a view (what they point to is the view's business).
struct NodeRef {
  const void* p = nullptr;
  explicit operator bool() const { return p != nullptr; }
  bool operator==(const NodeRef& o) const { return p == o.p; }
  bool operator!=(const NodeRef& o) const { return p != o.p; }
};
struct ValueRef {
  const void* p = nullptr;
  explicit operator bool() const { return p != nullptr; }
  bool operator==(const ValueRef& o) const { return p == o.p; }
  bool operator!=(const ValueRef& o) const { return p != o.p; }
};
struct NodeRefHash {
  size_t operator()(const NodeRef& n) const { return std::hash<const void*>()(n.p); }
};
struct Use {
  NodeRef user;
  size_t index; // which input of `user`
};

class GraphView {
 public:
  // Who differentiates the graph: eager autograd (FX graphs, run by
  // torch.compile's AOTAutograd or an ExportedProgram's module), or
  // TorchScript's executor (symbolic gradients for DifferentiableGraphs, which
  // keep what their scripts keep: aten::cat keeps its inputs there).
  enum class Autograd { Eager, TorchScript };

  virtual ~GraphView() = default;
  virtual Autograd autograd() const = 0;

  // Every node, blocks included, each block's nodes in order after its owner.
  virtual std::vector<NodeRef> nodes() const = 0;
  virtual std::string kind(NodeRef n) const = 0;                  // "aten::gelu"
  virtual const c10::FunctionSchema* schema(NodeRef n) const = 0; // null: none
  virtual size_t num_inputs(NodeRef n) const = 0;
  virtual ValueRef input(NodeRef n, size_t i) const = 0;
  virtual size_t num_outputs(NodeRef n) const = 0;
  virtual ValueRef output(NodeRef n, size_t i) const = 0;
  // The node (If, Loop) whose block holds `n`; null at the top level.
  virtual NodeRef owner(NodeRef n) const = 0;
  // Whether the graph's autograd differentiates `n` as one of its own ops
  // (TorchScript: autodiff's list; eager: every op).
  virtual bool differentiable(NodeRef n) const = 0;

  virtual NodeRef producer(ValueRef v) const = 0; // null: a graph input
  virtual size_t offset(ValueRef v) const = 0;    // which output of its producer
  virtual std::vector<Use> uses(ValueRef v) const = 0;
  virtual bool is_tensor(ValueRef v) const = 0;
  virtual std::optional<c10::IValue> constant(ValueRef v) const = 0;
  // Elements and dtype where known (complete shapes; FX: the size hints).
  virtual std::optional<int64_t> numel(ValueRef v) const = 0;
  virtual std::optional<c10::ScalarType> dtype(ValueRef v) const = 0;
  // The tensor's number of dimensions where known.
  virtual std::optional<int64_t> rank(ValueRef) const { return std::nullopt; }
  // The tensor's sizes where known (complete shapes).
  virtual std::optional<std::vector<int64_t>> sizes(ValueRef) const { return std::nullopt; }
  // Whether the tensor is contiguous (row-major), where known.
  virtual std::optional<bool> contiguous(ValueRef) const { return std::nullopt; }
  // The tensor's device type where known (what aten's kernels choose by: eager
  // dropout keeps a bool mask on CUDA, float noise on the CPU).
  virtual std::optional<c10::DeviceType> device(ValueRef v) const = 0;
  // How remarks name the value: "%h".
  virtual std::string name(ValueRef v) const = 0;
  // What the front end knows for sure about whether `v` requires grad in
  // training (a parameter, a buffer, a constant, a value made under no_grad);
  // nullopt: unknown, MayRequireGrad (core/recompute_regions.h) derives it.
  virtual std::optional<bool> requires_grad(ValueRef) const { return std::nullopt; }
  // Whether graph input `v` is a parameter or buffer of the module (FX:
  // torch.export's parameter / buffer placeholders). TorchScript reads module
  // state through prim::GetAttr instead, which the rules see by its producer.
  virtual bool module_state(ValueRef) const { return false; }

  // Derived facts.
  bool is_input(ValueRef v) const {
    const NodeRef p = producer(v);
    return !p || kind(p) == "prim::Param";
  }
  // `v`'s value where it is an int constant.
  std::optional<int64_t> int_constant(ValueRef v) const {
    const auto c = constant(v);
    if (!c || !c->isInt()) return std::nullopt;
    return c->toInt();
  }
  // A dim argument as a non-negative dim of `base`, or null (not a constant,
  // `base`'s rank unknown, out of range).
  std::optional<int64_t> dim_of(ValueRef dim, ValueRef base) const {
    const auto d = int_constant(dim);
    const auto r = rank(base);
    if (!d || !r || *d < -*r || *d >= *r) return std::nullopt;
    return *d < 0 ? *d + *r : *d;
  }
  std::optional<int64_t> bytes(ValueRef v) const {
    const auto n = numel(v);
    const auto t = dtype(v);
    if (!n || !t) return std::nullopt;
    return *n * int64_t(c10::elementSize(*t));
  }
};

} // namespace memslim
