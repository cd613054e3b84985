//===- jit_graph_view.cpp - a TorchScript graph as the core's GraphView ----===//
#include "memslim/jit/jit_graph_view.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/autodiff.h>

#include "memslim/jit/graph_iterator.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

namespace {
const Node* N(NodeRef n) { return static_cast<const Node*>(n.p); }
const Value* V(ValueRef v) { return static_cast<const Value*>(v.p); }
} // namespace

std::vector<NodeRef> JitGraphView::nodes() const {
  std::vector<NodeRef> out;
  if (!graph_) return out;
  std::shared_ptr<torch::jit::Graph> g = graph_;
  torch::jit::DepthFirstGraphNodeIterator it(g);
  for (Node* n = it.next(); n; n = it.next()) out.push_back(ref(n));
  return out;
}

std::string JitGraphView::kind(NodeRef n) const { return N(n)->kind().toQualString(); }

const c10::FunctionSchema* JitGraphView::schema(NodeRef n) const { return N(n)->maybeSchema(); }

size_t JitGraphView::num_inputs(NodeRef n) const { return N(n)->inputs().size(); }
ValueRef JitGraphView::input(NodeRef n, size_t i) const { return ref(N(n)->input(i)); }
size_t JitGraphView::num_outputs(NodeRef n) const { return N(n)->outputs().size(); }
ValueRef JitGraphView::output(NodeRef n, size_t i) const { return ref(N(n)->output(i)); }

NodeRef JitGraphView::owner(NodeRef n) const { return ref(N(n)->owningBlock()->owningNode()); }

bool JitGraphView::differentiable(NodeRef n) const { return torch::jit::isDifferentiable(N(n)); }

NodeRef JitGraphView::producer(ValueRef v) const { return ref(V(v)->node()); }
size_t JitGraphView::offset(ValueRef v) const { return V(v)->offset(); }

std::vector<Use> JitGraphView::uses(ValueRef v) const {
  std::vector<Use> out;
  for (const auto& u : V(v)->uses()) out.push_back({ref(u.user), u.offset});
  return out;
}

bool JitGraphView::is_tensor(ValueRef v) const {
  return V(v)->type()->cast<c10::TensorType>() != nullptr;
}

std::optional<c10::IValue> JitGraphView::constant(ValueRef v) const {
  return torch::jit::toIValue(V(v));
}

std::optional<int64_t> JitGraphView::numel(ValueRef v) const {
  auto t = V(v)->type()->cast<c10::TensorType>();
  if (!t) return std::nullopt;
  auto sizes = t->sizes().concrete_sizes();
  if (!sizes) return std::nullopt;
  int64_t n = 1;
  for (int64_t s : *sizes) n *= s;
  return n;
}

std::optional<std::vector<int64_t>> JitGraphView::sizes(ValueRef v) const {
  auto t = V(v)->type()->cast<c10::TensorType>();
  if (!t) return std::nullopt;
  return t->sizes().concrete_sizes();
}

std::optional<int64_t> JitGraphView::rank(ValueRef v) const {
  auto t = V(v)->type()->cast<c10::TensorType>();
  if (!t || !t->dim()) return std::nullopt;
  return static_cast<int64_t>(*t->dim());
}

std::optional<bool> JitGraphView::contiguous(ValueRef v) const {
  auto t = V(v)->type()->cast<c10::TensorType>();
  if (!t) return std::nullopt;
  const auto sizes = t->sizes().concrete_sizes();
  const auto strides = t->strides().concrete_sizes();
  if (!sizes || !strides || sizes->size() != strides->size()) return std::nullopt;
  int64_t expected = 1;
  for (size_t i = sizes->size(); i-- > 0;) {
    if ((*sizes)[i] != 1 && (*strides)[i] != expected) return false;
    expected *= (*sizes)[i];
  }
  return true;
}

std::optional<c10::ScalarType> JitGraphView::dtype(ValueRef v) const {
  auto t = V(v)->type()->cast<c10::TensorType>();
  if (!t) return std::nullopt;
  return t->scalarType();
}

std::optional<c10::DeviceType> JitGraphView::device(ValueRef v) const {
  auto t = V(v)->type()->cast<c10::TensorType>();
  if (!t || !t->device()) return std::nullopt;
  return t->device()->type();
}

std::string JitGraphView::name(ValueRef v) const { return "%" + V(v)->debugName(); }

std::optional<bool> JitGraphView::requires_grad(ValueRef v) const {
  const Node* n = V(v)->node();
  // A tensor constant (traced graphs) is no leaf that requires grad.
  if (n->kind() == c10::prim::Constant) return false;
  if (n->kind() == c10::prim::GetAttr && V(v)->type()->cast<c10::TensorType>()) {
    auto cls = n->input(0)->type()->cast<c10::ClassType>();
    auto slot = cls ? cls->findAttributeSlot(n->s(c10::attr::name)) : std::nullopt;
    if (cls && slot && !cls->is_parameter(*slot)) return false; // a buffer
  }
  return std::nullopt;
}

} // namespace memslim
