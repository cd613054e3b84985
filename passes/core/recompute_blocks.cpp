//===- recompute_blocks.cpp - whole blocks that keep only their inputs ------===//
//
// Segments, their prices and the budget ladder of recompute_blocks.h, over any
// GraphView (top-level nodes; a node's nested blocks count as the node).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/recompute_blocks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "memslim/core/recompute_regions.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();

// Ops whose result reads only a tensor's metadata (its data may be a block's
// input without being part of the block's computation).
bool metadata_op(const std::string& k) {
  return k == "aten::size" || k == "aten::dim" || k == "prim::dtype" || k == "prim::device" ||
         k == "prim::layout" || k == "aten::len" || k == "aten::numel";
}

// Last top-level index reading `v` (the graph's return: order.size());
// `data_only`: metadata reads (metadata_op) do not count.
size_t last_use(const Top& t, ValueRef v, bool data_only = false) {
  size_t last = 0;
  bool any = false;
  for (NodeRef u : t.users(v)) {
    if (data_only && metadata_op(t.g.kind(u))) continue;
    last = std::max(last, t.index(u));
    any = true;
  }
  return any ? last : kNone;
}

bool is_floating(const GraphView& g, ValueRef v) {
  const auto d = g.dtype(v);
  return d && c10::isFloatingType(*d);
}

// Forward work of one node (nested nodes counted by the caller): 2 per
// multiply-add of convolutions and matrix products (a weight's sizes: FX views
// have them since 2026-11-25 (8beef7f); before, FX convolutions counted one per output
// element), else one per element made.
double node_flops(const GraphView& g, NodeRef n) {
  std::string k = g.kind(n);
  // fuse-activation-consumer's memslim::act_<op>(input, weight, ...) is <op>
  // of act(input): the same product (the ladder runs after the pipeline).
  if (k.rfind("memslim::act_", 0) == 0) k = "aten::" + k.substr(13);
  double out = 0;
  for (size_t i = 0; i < g.num_outputs(n); ++i)
    if (g.is_tensor(g.output(n, i))) out += double(g.numel(g.output(n, i)).value_or(0));
  auto input_sizes = [&](size_t i) -> std::optional<std::vector<int64_t>> {
    if (i >= g.num_inputs(n) || !g.is_tensor(g.input(n, i))) return std::nullopt;
    return g.sizes(g.input(n, i));
  };
  if (k == "aten::conv1d" || k == "aten::conv2d" || k == "aten::conv3d" ||
      k == "aten::convolution" || k == "aten::_convolution") {
    const auto w = input_sizes(1);
    if (w && !w->empty() && (*w)[0] > 0) {
      double per = 1;
      for (size_t i = 1; i < w->size(); ++i) per *= double((*w)[i]);
      return 2 * out * per; // out elements x (in channels / groups x kernel)
    }
  }
  if (k == "aten::linear") {
    const auto w = input_sizes(1);
    if (w && w->size() == 2) return 2 * out * double((*w)[1]);
  }
  if (k == "aten::matmul" || k == "aten::mm" || k == "aten::bmm" || k == "aten::addmm" ||
      k == "aten::baddbmm" || k == "aten::einsum") {
    const auto a = input_sizes(k == "aten::addmm" || k == "aten::baddbmm" ? 1 : 0);
    if (a && !a->empty()) return 2 * out * double(a->back());
  }
  if (k == "aten::scaled_dot_product_attention") {
    // q [..., L, E] . k [..., S, E]^T, then the weights . v: out [..., L, Ev].
    const auto q = input_sizes(0), kk = input_sizes(1);
    if (q && kk && q->size() >= 2 && kk->size() >= 2) {
      double qn = 1;
      for (int64_t d : *q) qn *= double(d);
      const double s = double((*kk)[kk->size() - 2]);
      return 2 * qn * s + 2 * out * s;
    }
  }
  return out;
}

// A convolution or matrix product: more than 4 FLOPs per element it makes
// (the units a tag ladder splits blocks at).
bool heavy(const GraphView& g, NodeRef n) {
  double out = 0;
  for (size_t i = 0; i < g.num_outputs(n); ++i)
    if (g.is_tensor(g.output(n, i))) out += double(g.numel(g.output(n, i)).value_or(0));
  return out > 0 && node_flops(g, n) > 4 * out;
}

// Whether an external read of a segment carries the data flow around it
// (then a cut there is no block boundary): a value that may require grad and
// is no parameter or buffer read from the module. Masks and position ids need
// no grad; module state is alive anyway (GPT-2's tied embedding is read at
// both ends).
bool flow_value(const GraphView& g, const MayRequireGrad& grad, ValueRef v) {
  if (!g.is_tensor(v) || g.constant(v) || g.module_state(v)) return false;
  const NodeRef p = g.producer(v);
  if (p && g.kind(p) == "prim::GetAttr") return false;
  return grad(v);
}

// Whether a segment reads a flow value it does not make (besides its input).
bool reads_flow(const Top& t, const MayRequireGrad& grad, const Segment& s) {
  std::unordered_set<const void*> members;
  for (NodeRef n : s.fn.nodes) members.insert(n.p);
  for (NodeRef n : s.fn.nodes)
    for (ValueRef r : t.reads.at(n.p)) {
      const NodeRef m = t.maker(r);
      if (r != s.fn.input && !(m && members.count(m.p)) && flow_value(t.g, grad, r)) return true;
    }
  return false;
}

// The first cut from data value `v` (see recompute_blocks.h), or nullopt.
// Side nodes: what v's readers compute without the data flow (a causal mask,
// position ids or shapes from the token ids; LLaMA's rotary tables from the
// hidden state's dtype): values needing no grad, made from v's metadata (or
// from v itself when v needs no grad) and other side values only. They stay
// out of the segment (its externals where it reads them), so that a mask
// every later layer reads does not hold the cut open.
std::optional<Segment> cut_from(const Top& t, const MayRequireGrad& grad, ValueRef v) {
  const GraphView& g = t.g;
  size_t flow_last = 0; // the last read of an external flow value (see flow_value)
  const NodeRef vm = t.maker(v);
  const size_t start = vm ? t.index(vm) + 1 : 0;
  const bool v_flow = flow_value(g, grad, v);
  std::unordered_set<const void*> made{v.p}, side_made;
  std::unordered_map<const void*, size_t> open; // value -> last use, for made values read later
  std::unordered_map<const void*, ValueRef> open_ref;
  // v's metadata readers are side nodes (outside the block, where v is alive
  // anyway): only its data reads hold the cut open. Else a size() of v read
  // at the graph's end (GPT-2's output shape) keeps every cut from v open.
  const size_t vl = last_use(t, v, /*data_only=*/true);
  if (vl == kNone || vl < start) return std::nullopt;
  if (v_flow) {
    open[v.p] = vl;
    open_ref[v.p] = v;
  }
  Segment s;
  s.fn.input = v;
  std::vector<NodeRef> side_nodes;
  for (size_t k = start; k < t.order.size(); ++k) {
    const NodeRef n = t.order[k];
    bool hit = false;
    for (ValueRef r : t.reads.at(n.p)) hit = hit || made.count(r.p);
    bool member = false;
    if (hit) {
      bool side = true;
      for (size_t o = 0; o < g.num_outputs(n); ++o)
        side = side && !flow_value(g, grad, g.output(n, o));
      for (ValueRef r : t.reads.at(n.p)) {
        if (!made.count(r.p)) continue;
        if (r == v)
          side = side && (!v_flow || metadata_op(g.kind(n)));
        else
          side = side && side_made.count(r.p);
      }
      for (size_t o = 0; o < g.num_outputs(n); ++o) {
        made.insert(g.output(n, o).p);
        if (side) side_made.insert(g.output(n, o).p);
      }
      if (side) side_nodes.push_back(n);
      member = !side;
    }
    if (member) {
      for (ValueRef r : t.reads.at(n.p))
        if (!made.count(r.p) && flow_value(g, grad, r)) {
          const size_t l = last_use(t, r);
          if (l != kNone) flow_last = std::max(flow_last, l);
        }
      s.fn.nodes.push_back(n);
      for (size_t o = 0; o < g.num_outputs(n); ++o) {
        const ValueRef out = g.output(n, o);
        const size_t l = last_use(t, out);
        if (l != kNone && l > k) {
          open[out.p] = l;
          open_ref[out.p] = out;
        }
      }
    }
    for (auto it = open.begin(); it != open.end();)
      it = it->second <= k ? open.erase(it) : std::next(it);
    if (open.empty() && !s.fn.nodes.empty())
      return std::nullopt; // the flow ends (nothing read later)
    if (!member || open.size() != 1 || open.count(v.p) || flow_last > k) continue;
    const ValueRef y = open_ref.at(open.begin()->first);
    if (!g.is_tensor(y)) continue;
    s.fn.output = y;
    // Side nodes read by the segment alone (a view's shape list from the
    // input's sizes) go in with it: the op could not take an int[] as state.
    std::unordered_set<const void*> in(s.fn.nodes.size() * 2);
    for (NodeRef m : s.fn.nodes) in.insert(m.p);
    bool pulled = false;
    for (auto it = side_nodes.rbegin(); it != side_nodes.rend(); ++it) {
      bool only_in = true, used = false;
      for (size_t o = 0; o < g.num_outputs(*it); ++o)
        for (NodeRef u : t.users(g.output(*it, o))) {
          used = true;
          only_in = only_in && in.count(u.p);
        }
      if (used && only_in) {
        in.insert(it->p);
        s.fn.nodes.push_back(*it);
        pulled = true;
      }
    }
    if (pulled)
      std::sort(s.fn.nodes.begin(), s.fn.nodes.end(),
                [&](NodeRef a, NodeRef b) { return t.index(a) < t.index(b); });
    s.first = t.index(s.fn.nodes.front());
    s.last = k;
    return s;
  }
  return std::nullopt;
}

// External reads, flops and why-not of a found segment.
void describe(const Top& t, Segment& s) {
  const GraphView& g = t.g;
  std::unordered_set<const void*> members, made{s.fn.input.p};
  for (NodeRef n : s.fn.nodes) {
    members.insert(n.p);
    for (size_t o = 0; o < g.num_outputs(n); ++o) made.insert(g.output(n, o).p);
  }
  for (NodeRef n : s.fn.nodes)
    for (ValueRef r : t.reads.at(n.p))
      // Scalar constants are copied into the text; tensor constants (traced
      // graphs) are read like state (parseIR reads no tensor constant).
      // prim::Uninitialized (an early return's placeholder) is copied in too.
      if (!made.count(r.p) && !(g.constant(r) && !g.is_tensor(r)) &&
          !(g.producer(r) && g.kind(g.producer(r)) == "prim::Uninitialized") &&
          std::find(s.fn.external.begin(), s.fn.external.end(), r) == s.fn.external.end())
        s.fn.external.push_back(r);
  for (NodeRef n : s.fn.nodes) s.heavy = s.heavy || heavy(g, n);
  for (NodeRef n : g.nodes()) {
    if (!members.count(t.top_of(n).p)) continue;
    s.flops += node_flops(g, n);
    if (s.why.empty() && replay_unsafe(g.kind(n)))
      s.why = "it holds " + g.kind(n) + ", which a replay would repeat";
  }
  if (s.why.empty() && !is_floating(g, s.fn.output))
    s.why = "its result " + g.name(s.fn.output) + " is not a floating-point tensor";
}

// Bytes-relevant facts of the top-level block: what each top-level node makes
// autograd keep (the filters of kept_bytes: no parameters, buffers, constants,
// no-grad inputs), and each value's size.
struct Keeps {
  std::vector<std::vector<const void*>> by_node; // per top-level index
  std::unordered_map<const void*, int64_t> bytes;
  std::string why; // "" or the value whose size is unknown
};

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

// The prices of one choice of runs.
struct Figures {
  int64_t kept = 0, peak = 0;
};

class Pricer {
 public:
  Pricer(const Top& t, const std::vector<Segment>& segs, ApplyAs as = ApplyAs::Op)
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
  const std::string& why() const { return keeps_.why; }

  Figures price(const std::vector<BlockRun>& runs) const {
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

 private:
  const Top& t_;
  const std::vector<Segment>& segs_;
  Keeps keeps_;
  bool tags_;
  std::vector<std::vector<const void*>> inputs_; // per segment: countable input + externals
};

bool adjacent(const std::vector<Segment>& segs, size_t a) {
  return a + 1 < segs.size() && segs[a].joins_next;
}

// The cut of a run: its nodes, input, output and external reads.
FunctionCut run_cut(const GraphView& g, const std::vector<Segment>& segs, BlockRun r) {
  FunctionCut c;
  c.input = segs[r.begin].fn.input;
  c.output = segs[r.end - 1].fn.output;
  std::unordered_set<const void*> inner;
  for (size_t s = r.begin; s + 1 < r.end; ++s) inner.insert(segs[s].fn.output.p);
  for (size_t s = r.begin; s < r.end; ++s) {
    c.nodes.insert(c.nodes.end(), segs[s].fn.nodes.begin(), segs[s].fn.nodes.end());
    for (ValueRef e : segs[s].fn.external)
      if (!inner.count(e.p) &&
          std::find(c.external.begin(), c.external.end(), e) == c.external.end())
        c.external.push_back(e);
  }
  return c;
}

std::string describe_run(const GraphView& g, const std::vector<Segment>& segs, BlockRun r,
                         const std::string& unit = "segment") {
  std::ostringstream o;
  size_t nodes = 0;
  for (size_t s = r.begin; s < r.end; ++s) nodes += segs[s].fn.nodes.size();
  o << "block " << g.name(segs[r.begin].fn.input) << " -> " << g.name(segs[r.end - 1].fn.output)
    << " (" << (r.end - r.begin) << " " << unit << (r.end - r.begin == 1 ? "" : "s") << ", "
    << nodes << " ops)";
  return o.str();
}

} // namespace

RecomputeBlock run_block(const GraphView& g, const std::vector<Segment>& segs, BlockRun r,
                         const std::string& pass) {
  RecomputeBlock b;
  b.fn = run_cut(g, segs, r);
  b.covers = b.fn.nodes;
  b.guarded = {b.fn.input, b.fn.output};
  for (ValueRef e : b.fn.external)
    if (g.is_tensor(e)) b.guarded.push_back(e);
  b.decision.pass = pass;
  b.decision.site = describe_run(g, segs, r);
  for (size_t s = r.begin; s < r.end && b.decision.text.empty(); ++s)
    if (!segs[s].why.empty()) {
      b.decision.verdict = Decision::Verdict::Kept;
      b.decision.text = segs[s].why;
    }
  return b;
}

namespace {

std::vector<Segment> segments_of(const Top& t) {
  const GraphView& g = t.g;
  // The graph's tensor inputs, in order of first read (module objects are no
  // data: what flows from `self` is parameters and buffers).
  std::vector<ValueRef> seeds;
  for (NodeRef n : t.order)
    for (ValueRef r : t.reads.at(n.p))
      if (g.is_input(r) && g.is_tensor(r) &&
          std::find(seeds.begin(), seeds.end(), r) == seeds.end())
        seeds.push_back(r);
  // Each input's chain of cuts, the inputs in order of first read; a segment
  // overlapping one taken before is dropped (a weight given as a graph input,
  // as in memslim-opt's graphs, starts a chain through the same blocks). A
  // segment from a value needing no grad whose external reads do (a mask every
  // layer reads: the data flow runs through its reads, not its input) ends
  // its chain.
  const MayRequireGrad grad(g);
  std::unordered_set<const void*> taken;
  std::vector<Segment> out;
  for (ValueRef v : seeds) {
    std::unordered_set<const void*> visited;
    while (visited.insert(v.p).second) {
      auto s = cut_from(t, grad, v);
      if (!s) break;
      if (!flow_value(g, grad, v) && reads_flow(t, grad, *s)) break;
      v = s->fn.output;
      bool overlap = false;
      for (NodeRef n : s->fn.nodes) overlap = overlap || taken.count(n.p);
      if (overlap) continue;
      for (NodeRef n : s->fn.nodes) taken.insert(n.p);
      out.push_back(std::move(*s));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Segment& a, const Segment& b) { return a.first < b.first; });
  for (size_t i = 0; i < out.size(); ++i) {
    describe(t, out[i]);
    out[i].joins_next = i + 1 < out.size() && out[i].fn.output == out[i + 1].fn.input;
  }
  return out;
}

// `whole`: where given, each segment's pieces as a run.
std::vector<Segment> pieces_of(const Top& t, const std::vector<Segment>& segments,
                               std::vector<BlockRun>* whole = nullptr) {
  const GraphView& g = t.g;
  std::vector<Segment> out;
  auto close = [&](Segment& p) {
    std::unordered_set<const void*> members, made;
    for (NodeRef n : p.fn.nodes) {
      members.insert(n.p);
      for (size_t o = 0; o < g.num_outputs(n); ++o) {
        made.insert(g.output(n, o).p);
        p.fn.output = g.output(n, o);
      }
    }
    for (NodeRef n : p.fn.nodes)
      for (ValueRef r : t.reads.at(n.p))
        if (!made.count(r.p) && !(g.constant(r) && !g.is_tensor(r)) &&
            std::find(p.fn.external.begin(), p.fn.external.end(), r) == p.fn.external.end())
          p.fn.external.push_back(r);
    for (ValueRef e : p.fn.external)
      if (g.is_tensor(e)) {
        p.fn.input = e;
        break;
      }
    if (!p.fn.input && !p.fn.external.empty()) p.fn.input = p.fn.external.front();
    if (!p.fn.output) p.fn.output = p.fn.input;
    if (!p.fn.input) p.fn.input = p.fn.output;
    for (NodeRef n : g.nodes())
      if (members.count(t.top_of(n).p)) p.flops += node_flops(g, n);
    p.first = t.index(p.fn.nodes.front());
    p.last = t.index(p.fn.nodes.back());
    p.joins_next = true;
    for (NodeRef n : p.fn.nodes) p.heavy = p.heavy || heavy(g, n);
    out.push_back(std::move(p));
  };
  for (const Segment& s : segments) {
    const size_t begin = out.size();
    Segment cur;
    bool cur_heavy = false;
    for (NodeRef n : s.fn.nodes) {
      const bool h = heavy(g, n);
      if (!cur.fn.nodes.empty() && (h || cur_heavy)) {
        close(cur);
        cur = Segment();
      }
      cur.why = s.why;
      cur.fn.nodes.push_back(n);
      cur_heavy = h;
    }
    if (!cur.fn.nodes.empty()) close(cur);
    if (out.size() > begin) {
      out.back().joins_next = s.joins_next;
      if (whole) whole->push_back({begin, out.size()});
    }
  }
  return out;
}

} // namespace

std::vector<Segment> split_pieces(const GraphView& g, const std::vector<Segment>& segments) {
  return pieces_of(Top(g), segments);
}

std::vector<Segment> find_segments(const GraphView& g) { return segments_of(Top(g)); }

std::optional<int64_t> total_kept_bytes(const GraphView& g, std::string* unknown) {
  const Top t(g);
  const Keeps k = keeps_of(t);
  if (!k.why.empty()) {
    if (unknown) *unknown = k.why;
    return std::nullopt;
  }
  int64_t total = 0;
  for (const auto& [v, b] : k.bytes) total += b;
  return total;
}

std::vector<RecomputeBlock> find_recompute_blocks(const GraphView& g, const CostPolicy& policy) {
  const Top t(g);
  const std::vector<Segment> segs = segments_of(t);
  const Pricer pricer(t, segs);
  std::vector<RecomputeBlock> out;
  const Figures none = pricer.price({});
  for (size_t i = 0; i < segs.size(); ++i) {
    if (segs[i].fn.nodes.size() < 2) continue; // one op keeps what it reads either way
    RecomputeBlock b = run_block(g, segs, {i, i + 1}, kRecomputeBlocksPass);
    if (b.decision.text.empty() && !pricer.why().empty()) {
      b.decision.verdict = Decision::Verdict::Kept;
      b.decision.text =
          "sizes unknown (" + pricer.why() + "; run memslim.optimize with example inputs)";
    }
    if (b.decision.text.empty()) {
      const Figures f = pricer.price({{i, i + 1}});
      b.decision.price.before = none.kept;
      b.decision.price.after = f.kept;
      b.decision.price.added_work = 1; // the block runs once more in backward
      std::ostringstream text;
      const int64_t freed = none.kept - f.kept;
      if (freed < std::max<int64_t>(policy.min_bytes, 1)) {
        b.decision.verdict = Decision::Verdict::Kept;
        text << "frees " << freed << " B (its input and state are kept anyway)";
      } else {
        b.decision.verdict = Decision::Verdict::Rewrote;
        text << "-> " << kRecomputeBlockOp << ": keeps its input and state, frees " << freed
             << " B; re-runs " << segs[i].fn.nodes.size() << " ops in backward";
      }
      b.decision.text = text.str();
    }
    out.push_back(std::move(b));
  }
  return out;
}

BlockLadder block_ladder(const GraphView& g, std::vector<Segment> segments, int64_t stop_at,
                         const CostPolicy& policy, ApplyAs as) {
  const Top t(g);
  BlockLadder L;
  // Tags: the units are pieces, and a whole segment is a move of its own (the
  // greedy need not find a path to it piece by piece).
  std::vector<BlockRun> whole;
  L.segments = as == ApplyAs::Tags ? pieces_of(t, segments, &whole) : std::move(segments);
  const std::vector<Segment>& segs = L.segments;
  const Pricer pricer(t, segs, as);
  const std::string unit = as == ApplyAs::Tags ? "piece" : "segment";
  if (!pricer.why().empty()) {
    L.why = "the size of " + pricer.why() + " is unknown";
    return L;
  }
  LadderStep step;
  Figures now = pricer.price({});
  step.kept = now.kept;
  step.peak = now.peak;
  L.steps.push_back(step);
  const int64_t min_freed = std::max<int64_t>(policy.min_bytes, 1);
  auto valid = [&](size_t s) { return segs[s].why.empty(); };
  while (stop_at < 0 || step.kept > stop_at) {
    const std::vector<BlockRun>& runs = step.runs;
    std::vector<size_t> run_of(segs.size(), kNone);
    for (size_t r = 0; r < runs.size(); ++r)
      for (size_t s = runs[r].begin; s < runs[r].end; ++s) run_of[s] = r;
    // Candidate moves: (new runs, added flops, description).
    struct Move {
      std::vector<BlockRun> runs;
      double flops;
      std::string what;
    };
    std::vector<Move> moves;
    auto with = [&](std::vector<BlockRun> rs) {
      std::sort(rs.begin(), rs.end(),
                [](const BlockRun& a, const BlockRun& b) { return a.begin < b.begin; });
      return rs;
    };
    for (size_t s = 0; s < segs.size(); ++s) {
      if (run_of[s] != kNone || !valid(s)) continue;
      // A new run of one segment, or of two adjacent free ones.
      {
        auto rs = runs;
        rs.push_back({s, s + 1});
        moves.push_back(
            {with(rs), segs[s].flops, "recompute " + describe_run(g, segs, {s, s + 1}, unit)});
      }
      if (adjacent(segs, s) && run_of[s + 1] == kNone && valid(s + 1)) {
        auto rs = runs;
        rs.push_back({s, s + 2});
        moves.push_back({with(rs), segs[s].flops + segs[s + 1].flops,
                         "recompute " + describe_run(g, segs, {s, s + 2}, unit)});
      }
    }
    // A whole segment, taking in the runs that overlap it (one run).
    for (const BlockRun& w : whole) {
      bool ok = w.end - w.begin > 1, inside = true;
      double flops = 0;
      for (size_t s = w.begin; s < w.end; ++s) {
        ok = ok && valid(s);
        inside = inside && run_of[s] != kNone && run_of[s] == run_of[w.begin];
        if (run_of[s] == kNone) flops += segs[s].flops;
      }
      if (!ok || inside) continue;
      BlockRun cover = w;
      std::vector<BlockRun> rs;
      for (const BlockRun& r : runs)
        if (r.end <= w.begin || r.begin >= w.end) {
          rs.push_back(r);
        } else {
          cover.begin = std::min(cover.begin, r.begin);
          cover.end = std::max(cover.end, r.end);
        }
      rs.push_back(cover);
      moves.push_back({with(rs), flops, "recompute " + describe_run(g, segs, cover, unit)});
    }
    for (size_t r = 0; r < runs.size(); ++r) {
      const BlockRun cur = runs[r];
      // Extend by the free neighbour on either side.
      if (cur.begin > 0 && adjacent(segs, cur.begin - 1) && run_of[cur.begin - 1] == kNone &&
          valid(cur.begin - 1)) {
        auto rs = runs;
        rs[r] = {cur.begin - 1, cur.end};
        moves.push_back({with(rs), segs[cur.begin - 1].flops,
                         "extend to " + describe_run(g, segs, rs[r], unit)});
      }
      if (adjacent(segs, cur.end - 1) && cur.end < segs.size()) {
        if (run_of[cur.end] == kNone && valid(cur.end)) {
          auto rs = runs;
          rs[r] = {cur.begin, cur.end + 1};
          moves.push_back(
              {with(rs), segs[cur.end].flops, "extend to " + describe_run(g, segs, rs[r], unit)});
        } else if (run_of[cur.end] != kNone) {
          // Merge with the next run: no added work, one boundary less kept.
          auto rs = runs;
          const size_t other = run_of[cur.end];
          rs[r] = {cur.begin, runs[other].end};
          rs.erase(rs.begin() + long(other));
          moves.push_back(
              {with(rs), 0,
               "merge into " + describe_run(g, segs, {cur.begin, runs[other].end}, unit)});
        }
      }
    }
    // Tags: a move that makes a run touch the next one may also join them (no
    // work added, their boundary freed), in the same step: a piece joined to a
    // run often frees nothing until the boundary it leaves goes too.
    if (as == ApplyAs::Tags)
      for (size_t i = 0, n = moves.size(); i < n; ++i) {
        std::vector<BlockRun> joined;
        for (const BlockRun& r : moves[i].runs)
          if (!joined.empty() && joined.back().end == r.begin && adjacent(segs, r.begin - 1))
            joined.back().end = r.end;
          else
            joined.push_back(r);
        if (joined.size() == moves[i].runs.size()) continue;
        Move m{joined, moves[i].flops, moves[i].what + ", joined to its neighbour"};
        moves.push_back(std::move(m));
      }
    // The move freeing the most bytes per added work without raising the peak.
    const Move* best = nullptr;
    Figures best_f;
    double best_score = -1;
    for (const Move& m : moves) {
      const Figures f = pricer.price(m.runs);
      const int64_t freed = now.kept - f.kept;
      if (freed < min_freed || f.peak > now.peak) continue;
      const double score = double(freed) / (m.flops + 1.0);
      if (score > best_score) {
        best = &m;
        best_f = f;
        best_score = score;
      }
    }
    if (!best) break;
    step.runs = best->runs;
    step.light = true;
    for (const BlockRun& r : step.runs)
      for (size_t s = r.begin; s < r.end; ++s) step.light = step.light && !segs[s].heavy;
    step.kept = best_f.kept;
    step.peak = best_f.peak;
    step.flops += best->flops;
    step.move = best->what;
    now = best_f;
    L.steps.push_back(step);
  }
  return L;
}

std::vector<RecomputeBlock> ladder_blocks(const GraphView& g, const BlockLadder& ladder,
                                          size_t step) {
  std::vector<RecomputeBlock> out;
  const LadderStep& s = ladder.steps.at(step);
  for (const BlockRun& r : s.runs) {
    RecomputeBlock b = run_block(g, ladder.segments, r, kMemoryBudgetPass);
    if (b.decision.text.empty()) {
      b.decision.verdict = Decision::Verdict::Rewrote;
      b.decision.text = "-> " + std::string(kRecomputeBlockOp) +
                        ": keeps its input and state; re-runs it in backward";
    }
    out.push_back(std::move(b));
  }
  return out;
}

} // namespace memslim
