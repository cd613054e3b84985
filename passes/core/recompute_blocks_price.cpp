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
  std::vector<std::vector<const void*>> inputs;
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
    inputs.push_back(std::move(in));
  }
  // Dense ids, and each table in them.
  std::unordered_map<const void*, uint32_t> id;
  for (const auto& [v, b] : keeps_.bytes) {
    id.emplace(v, uint32_t(bytes_.size()));
    bytes_.push_back(b);
  }
  keeps_at_.resize(t.order.size());
  makes_at_.resize(t.order.size());
  for (size_t i = 0; i < t.order.size(); ++i) {
    for (const void* v : keeps_.by_node[i]) keeps_at_[i].push_back(id.at(v));
    for (size_t o = 0; o < t.g.num_outputs(t.order[i]); ++o) {
      const ValueRef v = t.g.output(t.order[i], o);
      const auto it = id.find(v.p);
      if (it != id.end() && storage_root(t.g, v) == v) makes_at_[i].push_back(it->second);
    }
  }
  for (size_t s = 0; s < segs.size(); ++s) {
    nodes_of_.emplace_back();
    for (NodeRef n : segs[s].fn.nodes) nodes_of_.back().push_back(t.index(n));
    inputs_.emplace_back();
    for (const void* v : inputs[s]) inputs_.back().push_back(id.at(v));
  }
  // freed()'s reverse tables.
  keepers_.resize(bytes_.size());
  readers_.resize(bytes_.size());
  maker_.assign(bytes_.size(), kNone);
  unit_of_.assign(t.order.size(), kNone);
  for (size_t i = 0; i < t.order.size(); ++i) {
    for (uint32_t v : keeps_at_[i]) keepers_[v].push_back(i);
    for (uint32_t v : makes_at_[i]) maker_[v] = i;
  }
  for (size_t s = 0; s < segs.size(); ++s) {
    std::vector<uint32_t> vals = inputs_[s];
    for (uint32_t v : inputs_[s]) readers_[v].push_back(s);
    for (size_t i : nodes_of_[s]) {
      local_ = local_ && unit_of_[i] == kNone;
      unit_of_[i] = s;
      vals.insert(vals.end(), keeps_at_[i].begin(), keeps_at_[i].end());
      vals.insert(vals.end(), makes_at_[i].begin(), makes_at_[i].end());
    }
    std::sort(vals.begin(), vals.end());
    vals.erase(std::unique(vals.begin(), vals.end()), vals.end());
    values_of_.push_back(std::move(vals));
  }
}

// Whether value v is kept when unit s is in the run starting at run_at[s] (kNone:
// in none), by price()'s rules.
bool Pricer::kept(uint32_t v, const std::vector<size_t>& run_at) const {
  auto run = [&](size_t i) { return unit_of_[i] == kNone ? kNone : run_at[unit_of_[i]]; };
  const size_t made = maker_[v] == kNone ? kNone : run(maker_[v]);
  for (size_t i : keepers_[v])
    if (run(i) == kNone && (!tags_ || made == kNone)) return true;
  for (size_t s : readers_[v])
    if (run_at[s] != kNone && run_at[s] != made) return true;
  return false;
}

int64_t Pricer::freed(const std::vector<BlockRun>& before,
                      const std::vector<BlockRun>& after) const {
  auto assign = [&](const std::vector<BlockRun>& runs) {
    std::vector<size_t> at(segs_.size(), kNone);
    for (const BlockRun& r : runs)
      for (size_t s = r.begin; s < r.end; ++s) at[s] = r.begin;
    return at;
  };
  const std::vector<size_t> a = assign(before), b = assign(after);
  std::vector<bool> seen(bytes_.size(), false);
  int64_t freed = 0;
  for (size_t s = 0; s < segs_.size(); ++s) {
    if (a[s] == b[s]) continue;
    for (uint32_t v : values_of_[s]) {
      if (seen[v]) continue;
      seen[v] = true;
      freed += (kept(v, a) ? bytes_[v] : 0) - (kept(v, b) ? bytes_[v] : 0);
    }
  }
  return freed;
}

Figures Pricer::price(const std::vector<BlockRun>& runs) const {
  const size_t n = t_.order.size(), ids = bytes_.size();
  // Which run covers each top-level index, and makes each storage (a view or
  // in-place write of what it reads is the read value's storage).
  std::vector<size_t> run_of(n, kNone), made(ids, kNone);
  for (size_t r = 0; r < runs.size(); ++r)
    for (size_t s = runs[r].begin; s < runs[r].end; ++s)
      for (size_t i : nodes_of_[s]) {
        run_of[i] = r;
        for (uint32_t v : makes_at_[i]) made[v] = r;
      }
  // Kept values and the lowest index keeping each (backward frees a value
  // once it has passed its lowest keeper).
  std::vector<size_t> lowest(ids, kNone);
  auto keep = [&](uint32_t v, size_t at) { lowest[v] = std::min(lowest[v], at); };
  // A tagged run's values are recomputed for every reader (not kept); an
  // op's output is kept where a later node keeps it.
  for (size_t i = 0; i < n; ++i)
    if (run_of[i] == kNone)
      for (uint32_t v : keeps_at_[i])
        if (!tags_ || made[v] == kNone) keep(v, i);
  for (size_t r = 0; r < runs.size(); ++r) {
    // The op stands where the run ended; a tagged run's first node reads
    // its inputs in backward last.
    const size_t at = tags_ ? segs_[runs[r].begin].first : segs_[runs[r].end - 1].last;
    // What the run's units read from outside it (a boundary between two
    // runs included: each has a checkpoint of its own).
    for (size_t s = runs[r].begin; s < runs[r].end; ++s)
      for (uint32_t v : inputs_[s])
        if (made[v] != r) keep(v, at);
  }
  Figures f;
  // upto[i]: the bytes whose lowest keeper is below i: what is alive when
  // backward reaches index i - 1.
  std::vector<int64_t> upto(n + 1, 0);
  for (size_t v = 0; v < ids; ++v)
    if (lowest[v] != kNone) {
      f.kept += bytes_[v];
      upto[lowest[v] + 1] += bytes_[v];
    }
  for (size_t i = 0; i < n; ++i) upto[i + 1] += upto[i];
  f.peak = f.kept;
  std::vector<size_t> seen(ids, kNone); // the run that counted a replayed value
  for (size_t r = 0; r < runs.size(); ++r) {
    const int64_t live = upto[segs_[runs[r].end - 1].last + 1];
    int64_t replay = 0;
    for (size_t s = runs[r].begin; s < runs[r].end; ++s)
      for (size_t i : nodes_of_[s])
        for (uint32_t v : keeps_at_[i])
          if (lowest[v] == kNone && seen[v] != r) {
            seen[v] = r;
            replay += bytes_[v];
          }
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
