//===- recompute_blocks_price.cpp - what a choice of blocks keeps ---------===//
//
// What: the storage-level kept-bytes model of recompute_blocks.h: what each top-level node
// makes autograd keep (its saved inputs and outputs by storage, the hidden saved tensors of
// max-pool and the norms), and the Pricer: the bytes kept and the backward's predicted
// peak (liveness) for one choice of recomputed runs, as an op or as tags.
// Why: the prices find_recompute_blocks and the budget ladder compare; total_kept_bytes,
// the figure a budget is a fraction of.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "memslim/core/recompute_blocks.h"
#include "memslim/core/recompute_blocks_detail.h"
#include "memslim/core/recompute_regions.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {
namespace blocks_detail {

namespace {

// Buffers count (the measurement excludes parameters only; BatchNorm's
// backward keeps its running stats); parameters, constants and inputs that
// need no grad do not.
bool countable(const GraphView& g, ValueRef v) {
  if (!g.is_tensor(v)) return false;
  const NodeRef p = g.producer(v);
  const bool buffer = g.requires_grad(v) == std::optional<bool>(false);
  if (((p && g.kind(p) == "prim::GetAttr") || g.module_state(v)) && !buffer) return false;
  if (g.constant(v)) return false;
  if (g.requires_grad(v) == std::optional<bool>(false) && g.is_input(v)) return false;
  return true;
}

// The value whose storage `v` shares: through in-place ops returning what they
// write (relu_) and views of a first input. What autograd keeps is counted per
// storage, as the measurement (saved_tensors_hooks, distinct storages) counts it.
ValueRef storage_root(const GraphView& g, ValueRef v) {
  for (int guard = 0; guard < 10000; ++guard) {
    const NodeRef p = g.producer(v);
    if (!p || g.num_inputs(p) == 0 || !g.is_tensor(g.input(p, 0))) return v;
    if (!saved::returns_written_first(g.schema(p)) && !saved::is_view_of_input(g, p, 0)) return v;
    v = g.input(p, 0);
  }
  return v;
}

// Bytes a node keeps for backward that are no value of the graph (aten's
// max-pool indices, a norm's per-group statistics), as eager autograd keeps
// them; 0 where unknown. They go when the node is recomputed.
int64_t hidden_bytes(const GraphView& g, NodeRef n) {
  const std::string k = g.kind(n);
  if (g.num_inputs(n) == 0 || g.num_outputs(n) == 0 || !g.is_tensor(g.input(n, 0))) return 0;
  const int64_t out = g.numel(g.output(n, 0)).value_or(0);
  const auto in = g.sizes(g.input(n, 0));
  if (k == "aten::max_pool1d" || k == "aten::max_pool2d" || k == "aten::max_pool3d")
    return out * 8;                           // int64 indices
  if (k == "memslim::max_pool2d") return out; // int8 window positions
  auto is = [&](const char* name) {
    return k == std::string("aten::") + name || k == std::string("memslim::") + name ||
           k == std::string("memslim::") + name + "_add";
  };
  if ((is("batch_norm") || is("instance_norm")) && in && in->size() >= 2)
    return 2 * 4 * (*in)[1] * (is("instance_norm") ? (*in)[0] : 1); // mean, invstd (fp32)
  if ((is("layer_norm") || is("rms_norm")) && in && g.num_inputs(n) > 1) {
    const auto shape = g.constant(g.input(n, 1));
    if (!shape || !shape->isIntList()) return 0;
    int64_t rows = 1;
    const size_t keep = in->size() - std::min(in->size(), shape->toIntVector().size());
    for (size_t i = 0; i < keep; ++i) rows *= (*in)[i];
    return (is("rms_norm") ? 1 : 2) * 4 * rows;
  }
  if (is("group_norm") && in && !in->empty() && g.num_inputs(n) > 1) {
    const auto groups = g.constant(g.input(n, 1));
    if (groups && groups->isInt()) return 2 * 4 * (*in)[0] * groups->toInt();
  }
  return 0;
}

} // namespace

Keeps keeps_of(const Top& t) {
  const GraphView& g = t.g;
  Keeps k;
  k.by_node.resize(t.order.size());
  // `nested`: the keeper sits in a nested block (an If's branch). A size the
  // recording run did not see there is a branch it did not take (a stochastic
  // depth at p = 0), which kept nothing on those inputs.
  auto add = [&](size_t at, ValueRef v, bool nested) {
    if (!countable(g, v)) return;
    v = storage_root(g, v);
    if (!countable(g, v)) return;
    const auto b = g.bytes(v);
    if (!b && nested) return;
    auto& list = k.by_node[at];
    if (std::find(list.begin(), list.end(), v.p) == list.end()) list.push_back(v.p);
    if (k.bytes.count(v.p)) return;
    if (!b && k.why.empty()) k.why = g.name(v);
    k.bytes[v.p] = b.value_or(0);
  };
  const MayRequireGrad grad(g);
  for (NodeRef n : g.nodes()) {
    const NodeRef top = t.top_of(n);
    if (!top) continue;
    const size_t at = t.index(top);
    const bool nested = top != n;
    // Autograd records nothing for an op none of whose inputs requires grad
    // (a causal mask, rotary tables, position ids).
    bool differentiated = false;
    for (size_t i = 0; i < g.num_inputs(n); ++i)
      differentiated = differentiated || grad(g.input(n, i));
    if (!differentiated) continue;
    // Hidden saved tensors: keyed by the node (no value has its address).
    if (const int64_t h = hidden_bytes(g, n)) {
      k.by_node[at].push_back(n.p);
      k.bytes[n.p] = h;
    }
    for (size_t i = 0; i < g.num_inputs(n); ++i)
      if (saved::keeps_input(g, n, i)) add(at, g.input(n, i), nested);
    // BatchNorm's backward keeps its running stats (buffers) too.
    const std::string kind = g.kind(n);
    if ((kind == "aten::batch_norm" || kind == "memslim::batch_norm" ||
         kind == "memslim::batch_norm_add") &&
        g.num_inputs(n) > 4)
      for (size_t i = 0; i < g.num_inputs(n); ++i)
        if (g.is_tensor(g.input(n, i)) &&
            g.requires_grad(g.input(n, i)) == std::optional<bool>(false) &&
            !g.constant(g.input(n, i)))
          add(at, g.input(n, i), nested);
    if (saved::keeps_output(g, n))
      for (size_t o = 0; o < g.num_outputs(n); ++o) add(at, g.output(n, o), nested);
  }
  return k;
}

Pricer::Pricer(const Top& t, const std::vector<Segment>& segs, ApplyAs as)
    : t_(t), segs_(segs), keeps_(keeps_of(t)), tags_(as == ApplyAs::Tags) {
  for (size_t i = 0; i < segs.size(); ++i) {
    std::vector<const void*> in;
    for (ValueRef v : segs[i].fn.external)
      if (countable(t.g, v) && countable(t.g, storage_root(t.g, v)))
        in.push_back(storage_root(t.g, v).p);
    if (countable(t.g, segs[i].fn.input) && countable(t.g, storage_root(t.g, segs[i].fn.input)))
      in.push_back(storage_root(t.g, segs[i].fn.input).p);
    for (const void* v : in)
      if (!keeps_.bytes.count(v)) {
        const auto b = t.g.bytes(ValueRef{v});
        if (!b && keeps_.why.empty()) keeps_.why = t.g.name(ValueRef{v});
        keeps_.bytes[v] = b.value_or(0);
      }
    inputs_.push_back(std::move(in));
  }
}

Figures Pricer::price(const std::vector<BlockRun>& runs) const {
  // Which run covers each top-level index.
  std::vector<size_t> run_of(t_.order.size(), kNone);
  for (size_t r = 0; r < runs.size(); ++r)
    for (size_t s = runs[r].begin; s < runs[r].end; ++s)
      for (NodeRef n : segs_[s].fn.nodes) run_of[t_.index(n)] = r;
  // The storages each run makes (a view or in-place write of what it reads
  // is the read value's storage).
  std::unordered_map<const void*, size_t> made;
  for (size_t i = 0; i < t_.order.size(); ++i) {
    if (run_of[i] == kNone) continue;
    for (size_t o = 0; o < t_.g.num_outputs(t_.order[i]); ++o) {
      const ValueRef v = t_.g.output(t_.order[i], o);
      if (storage_root(t_.g, v) == v) made[v.p] = run_of[i];
    }
  }
  // Kept values and the lowest index keeping each (backward frees a value
  // once it has passed its lowest keeper).
  std::unordered_map<const void*, size_t> lowest;
  auto keep = [&](const void* v, size_t at) {
    auto it = lowest.find(v);
    if (it == lowest.end())
      lowest.emplace(v, at);
    else
      it->second = std::min(it->second, at);
  };
  // A tagged run's values are recomputed for every reader (not kept); an
  // op's output is kept where a later node keeps it.
  for (size_t i = 0; i < t_.order.size(); ++i)
    if (run_of[i] == kNone)
      for (const void* v : keeps_.by_node[i])
        if (!tags_ || !made.count(v)) keep(v, i);
  for (size_t r = 0; r < runs.size(); ++r) {
    // The op stands where the run ended; a tagged run's first node reads
    // its inputs in backward last.
    const size_t at = tags_ ? segs_[runs[r].begin].first : segs_[runs[r].end - 1].last;
    // What the run's units read from outside it (a boundary between two
    // runs included: each has a checkpoint of its own).
    for (size_t s = runs[r].begin; s < runs[r].end; ++s)
      for (const void* v : inputs_[s]) {
        const auto it = made.find(v);
        if (it == made.end() || it->second != r) keep(v, at);
      }
  }
  Figures f;
  // (lowest keeper, bytes), sorted: what is alive when backward reaches an index.
  std::vector<std::pair<size_t, int64_t>> alive;
  alive.reserve(lowest.size());
  for (const auto& [v, at] : lowest) {
    f.kept += keeps_.bytes.at(v);
    alive.emplace_back(at, keeps_.bytes.at(v));
  }
  std::sort(alive.begin(), alive.end());
  std::vector<int64_t> upto(alive.size() + 1, 0);
  for (size_t i = 0; i < alive.size(); ++i) upto[i + 1] = upto[i] + alive[i].second;
  f.peak = f.kept;
  for (const BlockRun& r : runs) {
    const size_t at = segs_[r.end - 1].last;
    const auto end = std::upper_bound(alive.begin(), alive.end(),
                                      std::make_pair(at, std::numeric_limits<int64_t>::max()));
    const int64_t live = upto[size_t(end - alive.begin())];
    int64_t replay = 0;
    std::unordered_set<const void*> seen;
    for (size_t s = r.begin; s < r.end; ++s)
      for (NodeRef n : segs_[s].fn.nodes)
        for (const void* v : keeps_.by_node[t_.index(n)])
          if (!lowest.count(v) && seen.insert(v).second) replay += keeps_.bytes.at(v);
    f.peak = std::max(f.peak, live + replay);
  }
  return f;
}

} // namespace blocks_detail

std::optional<int64_t> total_kept_bytes(const GraphView& g, std::string* unknown) {
  const Top t(g);
  const blocks_detail::Keeps k = blocks_detail::keeps_of(t);
  if (!k.why.empty()) {
    if (unknown) *unknown = k.why;
    return std::nullopt;
  }
  int64_t total = 0;
  for (const auto& [v, b] : k.bytes) total += b;
  return total;
}

} // namespace memslim
