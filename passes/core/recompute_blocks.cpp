//===- recompute_blocks.cpp - whole blocks that keep only their inputs ------===//
//
// Segments, their prices and the budget ladder of recompute_blocks.h, over any
// GraphView (top-level nodes; a node's nested blocks count as the node). This file: the
// segments, their pieces and the rewrites; the prices: recompute_blocks_price.cpp; the
// ladder: recompute_blocks_ladder.cpp.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/recompute_blocks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "memslim/core/recompute_blocks_detail.h"
#include "memslim/core/recompute_regions.h"
#include "memslim/core/saved_tensors.h"

namespace memslim {

namespace {

using blocks_detail::kNone;

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

} // namespace

namespace blocks_detail {

bool adjacent(const std::vector<Segment>& segs, size_t a) {
  return a + 1 < segs.size() && segs[a].joins_next;
}

std::string describe_run(const GraphView& g, const std::vector<Segment>& segs, BlockRun r,
                         const std::string& unit) {
  std::ostringstream o;
  size_t nodes = 0;
  for (size_t s = r.begin; s < r.end; ++s) nodes += segs[s].fn.nodes.size();
  o << "block " << g.name(segs[r.begin].fn.input) << " -> " << g.name(segs[r.end - 1].fn.output)
    << " (" << (r.end - r.begin) << " " << unit << (r.end - r.begin == 1 ? "" : "s") << ", "
    << nodes << " ops)";
  return o.str();
}

std::vector<Segment> pieces_of(const Top& t, const std::vector<Segment>& segments,
                               std::vector<BlockRun>* whole) {
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

} // namespace blocks_detail

RecomputeBlock run_block(const GraphView& g, const std::vector<Segment>& segs, BlockRun r,
                         const std::string& pass) {
  RecomputeBlock b;
  b.fn = run_cut(g, segs, r);
  b.covers = b.fn.nodes;
  b.guarded = {b.fn.input, b.fn.output};
  for (ValueRef e : b.fn.external)
    if (g.is_tensor(e)) b.guarded.push_back(e);
  b.decision.pass = pass;
  b.decision.site = blocks_detail::describe_run(g, segs, r);
  for (size_t s = r.begin; s < r.end && b.decision.text.empty(); ++s)
    if (!segs[s].why.empty()) {
      b.decision.verdict = Decision::Verdict::Kept;
      b.decision.text = segs[s].why;
    }
  return b;
}

std::vector<Segment> split_pieces(const GraphView& g, const std::vector<Segment>& segments) {
  return blocks_detail::pieces_of(Top(g), segments);
}

std::vector<Segment> find_segments(const GraphView& g) { return segments_of(Top(g)); }

std::vector<RecomputeBlock> find_recompute_blocks(const GraphView& g, const CostPolicy& policy) {
  const Top t(g);
  const std::vector<Segment> segs = segments_of(t);
  const blocks_detail::Pricer pricer(t, segs);
  std::vector<RecomputeBlock> out;
  const blocks_detail::Figures none = pricer.price({});
  for (size_t i = 0; i < segs.size(); ++i) {
    if (segs[i].fn.nodes.size() < 2) continue; // one op keeps what it reads either way
    RecomputeBlock b = run_block(g, segs, {i, i + 1}, kRecomputeBlocksPass);
    if (b.decision.text.empty() && !pricer.why().empty()) {
      b.decision.verdict = Decision::Verdict::Kept;
      b.decision.text =
          "sizes unknown (" + pricer.why() + "; run memslim.optimize with example inputs)";
    }
    if (b.decision.text.empty()) {
      const blocks_detail::Figures f = pricer.price({{i, i + 1}});
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

} // namespace memslim
