//===- fx_graph_view.cpp - an aten-level FX graph as the core's GraphView --===//
#include "memslim/fx/fx_graph_view.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <stdexcept>

namespace memslim {

size_t FxGraphView::add_value(Value v) {
  v.id = values_.size();
  v.producer = -1;
  v.uses.clear();
  values_.push_back(std::move(v));
  return values_.size() - 1;
}

namespace {
const c10::FunctionSchema* registered_schema(const std::string& kind, const std::string& overload) {
  auto op = c10::Dispatcher::singleton().findSchema({kind, overload});
  if (!op)
    throw std::invalid_argument("memslim.fx: unknown op " + kind +
                                (overload.empty() ? "" : "." + overload));
  return &op->schema();
}
} // namespace

size_t FxGraphView::add_node(const std::string& kind, const std::optional<std::string>& overload,
                             const std::vector<size_t>& inputs,
                             const std::vector<size_t>& outputs) {
  Node n;
  n.id = nodes_.size();
  n.kind = kind;
  if (overload) n.schema = registered_schema(kind, *overload);
  for (size_t v : inputs)
    if (v >= values_.size()) throw std::invalid_argument("memslim.fx: bad input value id");
  for (size_t v : outputs)
    if (v >= values_.size() || values_[v].producer >= 0)
      throw std::invalid_argument("memslim.fx: bad or twice-produced output value id");
  n.inputs = inputs;
  n.outputs = outputs;
  nodes_.push_back(std::move(n));
  order_.push_back(nodes_.back().id);
  const Node& added = nodes_.back();
  for (size_t i = 0; i < inputs.size(); ++i)
    values_[inputs[i]].uses.push_back({NodeRef{&added}, i});
  for (size_t i = 0; i < outputs.size(); ++i) {
    values_[outputs[i]].producer = int(added.id);
    values_[outputs[i]].offset = i;
  }
  return added.id;
}

void FxGraphView::rewrite_node(size_t id, const std::string& kind, const std::string& overload,
                               const std::vector<size_t>& inputs) {
  Node& n = nodes_.at(id);
  for (size_t v : inputs)
    if (v >= values_.size()) throw std::invalid_argument("memslim.fx: bad input value id");
  n.schema = registered_schema(kind, overload);
  n.kind = kind;
  for (size_t v : n.inputs) {
    auto& uses = values_[v].uses;
    uses.erase(std::remove_if(uses.begin(), uses.end(),
                              [&](const Use& u) { return u.user == NodeRef{&n}; }),
               uses.end());
  }
  n.inputs = inputs;
  for (size_t i = 0; i < inputs.size(); ++i) values_[inputs[i]].uses.push_back({NodeRef{&n}, i});
}

void FxGraphView::erase_node(size_t id) {
  Node& n = nodes_.at(id);
  for (size_t v : n.inputs) {
    auto& uses = values_[v].uses;
    uses.erase(std::remove_if(uses.begin(), uses.end(),
                              [&](const Use& u) { return u.user == NodeRef{&n}; }),
               uses.end());
  }
  n.inputs.clear();
  n.erased = true;
}

size_t FxGraphView::insert_node_before(size_t before, const std::string& kind,
                                       const std::optional<std::string>& overload,
                                       const std::vector<size_t>& inputs,
                                       const std::vector<size_t>& outputs) {
  auto at = std::find(order_.begin(), order_.end(), before);
  if (at == order_.end() || nodes_.at(before).erased)
    throw std::invalid_argument("memslim.fx: no node to insert before");
  const size_t pos = size_t(at - order_.begin());
  const size_t id = add_node(kind, overload, inputs, outputs);
  order_.pop_back();
  order_.insert(order_.begin() + std::ptrdiff_t(pos), id);
  return id;
}

void FxGraphView::move_uses(size_t from, size_t to, const std::vector<size_t>& except) {
  auto& uses = values_.at(from).uses;
  std::vector<Use> kept;
  for (const Use& u : uses) {
    const size_t user = id(u.user);
    if (std::find(except.begin(), except.end(), user) != except.end()) {
      kept.push_back(u);
      continue;
    }
    nodes_.at(user).inputs.at(u.index) = to;
    values_.at(to).uses.push_back(u);
  }
  uses = std::move(kept);
}

std::vector<NodeRef> FxGraphView::nodes() const {
  std::vector<NodeRef> out;
  out.reserve(order_.size());
  for (size_t id : order_)
    if (!nodes_[id].erased) out.push_back(NodeRef{&nodes_[id]});
  return out;
}

} // namespace memslim
