//===- top_level.h - a graph's top-level block, for cutting functions out --===//
//
// What: the facts the passes that cut a piece of the model out into an op
// read (invertible-couplings: F and G; recompute-blocks: whole blocks): the
// top-level nodes in order, with a node's nested blocks counting as the node
// (BatchNorm's size checks sit in If blocks) and the graph's return counting
// as a reader after everything; data-flow slices; the bytes a set of nodes
// makes autograd keep; the node kinds a replay must not repeat; and the cut
// itself (nodes, data input, result, external reads).
// Why one header: the couplings matcher and the block finder slice the same
// way and price the same way; two copies would drift.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "memslim/core/graph_view.h"

namespace memslim {

// A function cut out of the graph: its top-level nodes in program order, the
// data value it reads (a block input), the value it makes (and a second one,
// an affine coupling's shift; else null), and what else it reads (not
// constants), in order of first read.
struct FunctionCut {
  std::vector<NodeRef> nodes;
  ValueRef input, output, output2;
  std::vector<ValueRef> external;
};

using ValueSet = std::unordered_set<const void*>;

// The top-level block as the matchers read it.
struct Top {
  const GraphView& g;
  std::vector<NodeRef> order;
  std::unordered_map<const void*, size_t> pos;                  // top-level node -> index in order
  std::unordered_map<const void*, NodeRef> top;                 // any node -> its top-level node
  std::unordered_map<const void*, std::vector<ValueRef>> reads; // from outside the node

  explicit Top(const GraphView& view) : g(view) {
    const std::vector<NodeRef> all = g.nodes();
    for (NodeRef n : all) {
      NodeRef t = n;
      while (g.owner(t)) t = g.owner(t);
      top[n.p] = t;
      if (t == n) {
        pos[n.p] = order.size();
        order.push_back(n);
      }
    }
    for (NodeRef n : all) {
      const NodeRef t = top.at(n.p);
      auto& r = reads[t.p];
      for (size_t i = 0; i < g.num_inputs(n); ++i) {
        const ValueRef v = g.input(n, i);
        const NodeRef p = g.producer(v);
        if (p && top_of(p) == t) continue; // made inside the same top-level node
        if (std::find(r.begin(), r.end(), v) == r.end()) r.push_back(v);
      }
    }
    // What a nested block returns (`-> (%v)`; its return is no node of the
    // view) is read by that block's top-level node too: ViT's attention hoists
    // `dropout` out of an If whose branch only returns it.
    for (NodeRef n : all)
      for (size_t o = 0; o < g.num_outputs(n); ++o) {
        const ValueRef v = g.output(n, o);
        for (const Use& u : g.uses(v)) {
          if (top.count(u.user.p) || !g.owner(u.user)) continue;
          NodeRef t = g.owner(u.user);
          while (g.owner(t)) t = g.owner(t);
          if (t == top.at(n.p)) continue;
          auto& r = reads[t.p];
          if (std::find(r.begin(), r.end(), v) == r.end()) r.push_back(v);
        }
      }
  }
  // The top-level node holding `n`; null for a graph input's param node.
  NodeRef top_of(NodeRef n) const {
    auto it = top.find(n.p);
    if (it != top.end()) return it->second;
    NodeRef t = n;
    while (g.owner(t)) t = g.owner(t);
    return pos.count(t.p) ? t : NodeRef{};
  }
  // The top-level node making `v`, or null (a graph input).
  NodeRef maker(ValueRef v) const {
    const NodeRef p = g.producer(v);
    return p ? top_of(p) : NodeRef{};
  }
  // A top-level node's place; the graph's return (and anything else outside
  // the list) comes last.
  size_t index(NodeRef n) const {
    auto it = pos.find(n.p);
    return it == pos.end() ? order.size() : it->second;
  }
  // The top-level users of v (the graph's return node included).
  std::vector<NodeRef> users(ValueRef v) const {
    std::vector<NodeRef> out;
    for (const Use& u : g.uses(v)) {
      NodeRef t = top_of(u.user);
      if (!t) t = u.user;
      if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
    }
    return out;
  }
  // Values depending on `seeds` through top-level nodes in [from, to).
  ValueSet forward(const std::vector<ValueRef>& seeds, size_t from, size_t to,
                   std::vector<NodeRef>* nodes = nullptr) const {
    ValueSet s;
    for (ValueRef v : seeds) s.insert(v.p);
    for (size_t i = from; i < to && i < order.size(); ++i) {
      const NodeRef n = order[i];
      bool hit = false;
      for (ValueRef v : reads.at(n.p)) hit = hit || s.count(v.p);
      if (!hit) continue;
      if (nodes) nodes->push_back(n);
      for (size_t k = 0; k < g.num_outputs(n); ++k) s.insert(g.output(n, k).p);
    }
    return s;
  }
};

// Node kinds a cut function may not hold: they would run again in every replay.
bool replay_unsafe(const std::string& kind);

// Bytes the covered top-level nodes make autograd keep, beyond parameters and
// what others keep anyway; nullopt where a size is unknown.
std::optional<int64_t> kept_bytes(const Top& t, const std::vector<NodeRef>& covers);

} // namespace memslim
