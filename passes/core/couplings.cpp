//===- couplings.cpp - additive coupling blocks and their chains -----------===//
//
// Matching and pricing of couplings.h over any GraphView: top-level nodes
// only (a node's nested blocks count as the node: BatchNorm's size checks sit
// in If blocks), slices by data flow, chains by their links.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/couplings.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "memslim/core/canonicalize.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/saved_tensors.h"
#include "memslim/core/top_level.h"

namespace memslim {

namespace {

bool unit_alpha(const GraphView& g, NodeRef add) {
  if (g.num_inputs(add) < 2 || g.num_inputs(add) > 3) return false;
  if (g.num_inputs(add) == 3) {
    const auto a = scalar_constant(g, g.input(add, 2));
    if (!a || *a != 1) return false;
  }
  return g.is_tensor(g.input(add, 0)) && g.is_tensor(g.input(add, 1)) && g.num_outputs(add) == 1;
}

bool is_add(const GraphView& g, NodeRef n) { return g.kind(n) == "aten::add" && unit_alpha(g, n); }

// One way a node can end a coupling half: y = x (+) the function's outputs.
struct Half {
  Combine combine = Combine::Add;
  NodeRef last, inner;      // inner: the affine half's first node (null: additive)
  ValueRef x, out, out2, y; // out: f, or m with out2 = t
};

bool is_mul(const GraphView& g, NodeRef n) {
  return g.kind(n) == "aten::mul" && g.num_inputs(n) == 2 && g.num_outputs(n) == 1 &&
         g.is_tensor(g.input(n, 0)) && g.is_tensor(g.input(n, 1));
}

// The halves node `n` can end: an add (additive, or the shift of x * m + t), or
// a mul ((x + t) * m). The inner node's result must be read by `n` alone.
std::vector<Half> halves_at(const Top& t, NodeRef n) {
  const GraphView& g = t.g;
  std::vector<Half> out;
  const bool add = is_add(g, n), mul = is_mul(g, n);
  if (!add && !mul) return out;
  for (int k = 0; k < 2; ++k) {
    const ValueRef inner_v = g.input(n, k), other = g.input(n, 1 - k);
    const NodeRef in = g.producer(inner_v);
    const bool inner_ok = in && t.top_of(in) == in && g.uses(inner_v).size() == 1;
    // x * m + t / (x + t) * m: the inner node's inputs, either order.
    if (inner_ok && ((add && is_mul(g, in)) || (mul && is_add(g, in))))
      for (int j = 0; j < 2; ++j) {
        Half h;
        h.combine = add ? Combine::MulAdd : Combine::AddMul;
        h.last = n;
        h.inner = in;
        h.x = g.input(in, j);
        h.out = add ? g.input(in, 1 - j) : other;
        h.out2 = add ? other : g.input(in, 1 - j);
        h.y = g.output(n, 0);
        if (h.out != h.out2 && h.x != h.out && h.x != h.out2) out.push_back(h);
      }
  }
  if (add) // y = x + f, either order
    for (int k = 0; k < 2; ++k) {
      Half h;
      h.last = n;
      h.x = g.input(n, k);
      h.out = g.input(n, 1 - k);
      h.y = g.output(n, 0);
      out.push_back(h);
    }
  return out;
}

// F (or G) of half `h`: the top-level nodes in [from, to) reading `in`
// through their own values, but for the half's inner node; "" or why it is no
// function of `in` alone making h's outputs.
std::string function_of(const Top& t, ValueRef in, const Half& h, size_t from, size_t to,
                        const ValueSet& forbidden, CouplingFn& fn) {
  const GraphView& g = t.g;
  fn = CouplingFn{};
  fn.input = in;
  fn.output = h.out;
  fn.output2 = h.out2;
  std::vector<NodeRef> reached;
  t.forward({in}, from, to, &reached);
  for (NodeRef n : reached)
    if (n != h.inner) fn.nodes.push_back(n);
  std::unordered_set<const void*> members;
  for (NodeRef n : fn.nodes) members.insert(n.p);
  ValueSet made;
  for (NodeRef n : fn.nodes)
    for (size_t k = 0; k < g.num_outputs(n); ++k) made.insert(g.output(n, k).p);
  for (ValueRef o : {h.out, h.out2}) {
    if (!o) continue;
    const NodeRef m = t.maker(o);
    if (!m || !made.count(o.p) || !members.count(m.p)) return "no function of " + g.name(in);
  }
  // The one node each output may feed: the add (f; an affine half's t in
  // x * m + t), the inner node (m there; t in (x + t) * m), the last (m there).
  auto allowed = [&](ValueRef v, NodeRef u) {
    if (v == h.out) return u == (h.combine == Combine::MulAdd ? h.inner : h.last);
    if (v == h.out2) return u == (h.combine == Combine::MulAdd ? h.last : h.inner);
    return false;
  };
  for (NodeRef n : fn.nodes) {
    for (size_t k = 0; k < g.num_outputs(n); ++k) {
      const ValueRef v = g.output(n, k);
      size_t outside = 0;
      for (NodeRef u : t.users(v)) {
        if (members.count(u.p)) continue;
        if (!allowed(v, u)) return "its value " + g.name(v) + " is also read outside it";
        ++outside;
      }
      if ((v == h.out || v == h.out2) && outside != 1) return "its result is also read elsewhere";
    }
    for (ValueRef v : t.reads.at(n.p)) {
      if (v == in || made.count(v.p)) continue;
      // Scalar constants are copied into the function's text; tensor constants
      // (a traced graph's, memslim.compile's chain pieces) are read like state:
      // parseIR reads no tensor constant.
      if (g.constant(v) && !g.is_tensor(v)) continue;
      if (forbidden.count(v.p)) return "it reads " + g.name(v) + ", which depends on a block input";
      if (std::find(fn.external.begin(), fn.external.end(), v) == fn.external.end())
        fn.external.push_back(v);
    }
  }
  // What a replay would repeat, in the function's nested blocks too.
  for (NodeRef n : g.nodes()) {
    if (!members.count(t.top_of(n).p)) continue;
    if (replay_unsafe(g.kind(n))) return "it holds " + g.kind(n) + ", which a replay would repeat";
  }
  return "";
}

// The coupling whose first half ends at `n1`, if any; `why` gets the reason a
// found coupling cannot join the op (then the result is still returned). A
// refused reading does not end the search: a Glow half's inner x2 + t reads as
// an additive half whose G is refused, the mul after it completes the coupling.
std::optional<Coupling> match(const Top& t, NodeRef n1, std::string& why) {
  const GraphView& g = t.g;
  why.clear();
  std::optional<Coupling> refused;
  std::string refused_why;
  auto refuse = [&](Coupling& c, std::string reason) {
    if (!refused) {
      refused = c;
      refused_why = std::move(reason);
    }
  };
  const size_t i1 = t.index(n1);
  const ValueRef y1 = g.output(n1, 0);
  const ValueSet after_y1 = t.forward({y1}, i1 + 1, t.order.size());
  for (const Half& h1 : halves_at(t, n1)) {
    const ValueRef x1 = h1.x;
    if (!t.maker(h1.out)) continue;
    for (size_t i2 = i1 + 1; i2 < t.order.size(); ++i2) {
      for (const Half& h2 : halves_at(t, t.order[i2])) {
        const ValueRef x2 = h2.x;
        if (!after_y1.count(h2.out.p) || (h2.out2 && !after_y1.count(h2.out2.p)) ||
            after_y1.count(x2.p) || x2 == x1)
          continue;
        const NodeRef x2m = t.maker(x2), x1m = t.maker(x1);
        const size_t from = std::max(x2m ? t.index(x2m) + 1 : 0, x1m ? t.index(x1m) + 1 : 0);
        size_t f_end = t.index(t.maker(h1.out));
        if (h1.out2 && t.maker(h1.out2)) f_end = std::max(f_end, t.index(t.maker(h1.out2)));
        if (from > f_end) continue;
        Coupling c;
        c.add1 = n1;
        c.add2 = h2.last;
        c.inner1 = h1.inner;
        c.inner2 = h2.inner;
        c.combine1 = h1.combine;
        c.combine2 = h2.combine;
        c.x1 = x1;
        c.x2 = x2;
        c.y1 = y1;
        c.y2 = h2.y;
        // F: x2's readers before the first half. x1 must not depend on x2 (nor x2 on x1).
        const ValueSet from_x1 = t.forward({x1}, from, t.order.size());
        const ValueSet from_x2 = t.forward({x2}, from, t.order.size());
        if (from_x2.count(x1.p) || from_x1.count(x2.p)) continue;
        ValueSet forbid_f = from_x1;
        forbid_f.insert(x1.p);
        const std::string fwhy = function_of(t, x2, h1, from, i1, forbid_f, c.F);
        if (fwhy.rfind("no function", 0) == 0) continue;
        if (!fwhy.empty()) { // y1 = x1 (+) F(x2), y2 = x2 (+) G(y1): a coupling, refused
          refuse(c, "F: " + fwhy);
          continue;
        }
        // Found F; from here on a refusal is a remark.
        ValueSet forbid_g = from_x2;
        forbid_g.insert(x2.p);
        forbid_g.insert(x1.p);
        for (const void* v : from_x1) forbid_g.insert(v);
        forbid_g.erase(y1.p);
        const std::string gwhy = function_of(t, y1, h2, i1 + 1, i2, forbid_g, c.G);
        if (!gwhy.empty()) {
          if (gwhy.rfind("no function", 0) == 0) continue;
          refuse(c, "G: " + gwhy);
          continue;
        }
        // F must not read what G or the halves make (it runs first).
        std::string xwhy;
        for (ValueRef v : c.F.external)
          if (xwhy.empty() && from_x2.count(v.p))
            xwhy = "F reads " + g.name(v) + ", which depends on x2";
        if (!xwhy.empty()) {
          refuse(c, xwhy);
          continue;
        }
        return c;
      }
    }
  }
  why = refused_why;
  return refused;
}

// The link from block a's outputs to block b's inputs: 0 direct, 1 through
// chunk(cat([y1, y2], d1), 2, d2); nullopt when b's inputs come otherwise.
// `nodes` gets the link's nodes (ListConstruct, cat, chunk, ListUnpack, copies;
// TupleConstruct and TupleUnpack for a direct link through a tuple), `d1` /
// `d2` the dims (ints: constants, or values such as a module's attribute).
std::optional<int64_t> link(const Top& t, const Coupling& a, const Coupling& b,
                            std::vector<NodeRef>& nodes, ValueRef& d1, ValueRef& d2) {
  const GraphView& g = t.g;
  if (b.x1 == a.y1 && b.x2 == a.y2) return 0;
  // A pair module's `return a, b` inlined (TorchScript): b's inputs unpack the
  // tuple a's outputs made, the same values; a direct link whose two nodes the
  // op covers. A tuple read by anything else keeps the link out.
  if (const NodeRef u = g.producer(b.x1); u && g.kind(u) == "prim::TupleUnpack" &&
                                          g.num_inputs(u) == 1 && g.num_outputs(u) == 2 &&
                                          g.output(u, 0) == b.x1 && g.output(u, 1) == b.x2) {
    const NodeRef c = g.producer(g.input(u, 0));
    if (!c || g.kind(c) != "prim::TupleConstruct" || g.num_inputs(c) != 2 ||
        g.input(c, 0) != a.y1 || g.input(c, 1) != a.y2 || g.uses(g.output(c, 0)).size() != 1)
      return std::nullopt;
    nodes = {c, u};
    return 0;
  }
  // memcnn's `x1, x2 = x1.contiguous(), x2.contiguous()` after the chunk: the
  // same values (a copy at most), so the copies join the link (the op feeds F
  // the chunk's pieces). A piece read by anything else keeps the link out.
  std::vector<NodeRef> copies;
  auto before_copy = [&](ValueRef x) {
    const NodeRef c = g.producer(x);
    if (!c || g.kind(c) != "aten::contiguous" || g.uses(g.input(c, 0)).size() != 1) return x;
    copies.push_back(c);
    return g.input(c, 0);
  };
  const ValueRef x1 = before_copy(b.x1), x2 = before_copy(b.x2);
  // b's inputs: chunk's list unpacked (TorchScript), or chunk's two outputs
  // themselves (an FX graph's getitems are not nodes of the view).
  const NodeRef p = g.producer(x1);
  auto splits_into_b = [&](NodeRef n) {
    return n && g.producer(x2) == n && g.num_outputs(n) == 2 && g.output(n, 0) == x1 &&
           g.output(n, 1) == x2;
  };
  if (!splits_into_b(p)) return std::nullopt;
  const bool unpacked = g.kind(p) == "prim::ListUnpack";
  const NodeRef chunk = unpacked ? g.producer(g.input(p, 0)) : p;
  if (!chunk || g.kind(chunk) != "aten::chunk" || g.num_inputs(chunk) != 3) return std::nullopt;
  const auto pieces = scalar_constant(g, g.input(chunk, 1));
  const NodeRef cat = g.producer(g.input(chunk, 0));
  if (!pieces || *pieces != 2 || !cat || g.kind(cat) != "aten::cat" || g.num_inputs(cat) != 2)
    return std::nullopt;
  d1 = g.input(cat, 1);
  d2 = g.input(chunk, 2);
  const NodeRef list = g.producer(g.input(cat, 0));
  if (g.is_tensor(d1) || g.is_tensor(d2) || !list || g.kind(list) != "prim::ListConstruct" ||
      g.num_inputs(list) != 2 || g.input(list, 0) != a.y1 || g.input(list, 1) != a.y2)
    return std::nullopt;
  // Each link value read by the next link node alone.
  for (NodeRef n : {list, cat})
    if (g.uses(g.output(n, 0)).size() != 1) return std::nullopt;
  if (unpacked && g.uses(g.output(chunk, 0)).size() != 1) return std::nullopt;
  nodes = {list, cat, chunk};
  if (unpacked) nodes.push_back(p);
  nodes.insert(nodes.end(), copies.begin(), copies.end());
  return 1;
}

// Whether every top-level reader of `v` is in `allowed`.
bool read_only_by(const Top& t, ValueRef v, const std::unordered_set<const void*>& allowed) {
  for (NodeRef u : t.users(v))
    if (!allowed.count(u.p)) return false;
  return true;
}

// The couplings in program order (a node belongs to one coupling at most; `taken`
// gets their nodes), and the readings refused with why (`refused`).
std::vector<Coupling> find_couplings(const Top& t, std::vector<CouplingChain>& refused,
                                     std::unordered_set<const void*>& taken) {
  const GraphView& g = t.g;
  std::vector<Coupling> found;
  for (NodeRef n : t.order) {
    if ((!is_add(g, n) && !is_mul(g, n)) || taken.count(n.p)) continue;
    std::string why;
    auto c = match(t, n, why);
    if (!c) continue;
    auto site = [&](const Coupling& k) { return "coupling at " + g.name(k.y2); };
    if (!why.empty()) {
      CouplingChain kept;
      kept.blocks = {*c};
      kept.decision.pass = kInvertibleCouplingsPass;
      kept.decision.site = site(*c);
      kept.decision.verdict = Decision::Verdict::Kept;
      kept.decision.text = why;
      refused.push_back(std::move(kept));
      continue;
    }
    bool overlap = false;
    for (const CouplingFn* f : {&c->F, &c->G})
      for (NodeRef m : f->nodes) overlap = overlap || taken.count(m.p);
    for (NodeRef m : c->combine_nodes()) overlap = overlap || (m != n && taken.count(m.p));
    if (overlap) continue;
    for (const CouplingFn* f : {&c->F, &c->G})
      for (NodeRef m : f->nodes) taken.insert(m.p);
    for (NodeRef m : c->combine_nodes()) taken.insert(m.p);
    found.push_back(std::move(*c));
  }
  return found;
}

// The chain starting at found[i]: the linked couplings after it whose inner values
// nobody else reads go into `ch` (its link kinds and dims; `link_nodes` their link's
// nodes). Returns the index after the chain's last coupling.
size_t extend_chain(const Top& t, const std::vector<Coupling>& found, size_t i, CouplingChain& ch,
                    std::vector<NodeRef>& link_nodes) {
  ch.blocks.push_back(found[i]);
  size_t j = i + 1;
  for (; j < found.size(); ++j) {
    const Coupling& a = ch.blocks.back();
    const Coupling& b = found[j];
    std::vector<NodeRef> ln;
    ValueRef d1, d2;
    const auto kind = link(t, a, b, ln, d1, d2);
    if (!kind) break;
    // a's outputs: read by a's G / second half and the link (or b's F /
    // halves) only.
    std::unordered_set<const void*> ok;
    for (NodeRef m : a.G.nodes) ok.insert(m.p);
    for (NodeRef m : a.combine_nodes()) ok.insert(m.p);
    // A link with nodes (a chunk's, a tuple's) hands a's outputs to its first node.
    if (!ln.empty()) {
      ok.insert(ln.front().p);
    } else {
      for (NodeRef m : b.F.nodes) ok.insert(m.p);
      for (NodeRef m : b.combine_nodes()) ok.insert(m.p);
    }
    if (!read_only_by(t, a.y1, ok) || !read_only_by(t, a.y2, ok)) break;
    if (!ln.empty()) {
      // b's inputs come from the link alone; read by b only.
      std::unordered_set<const void*> bo;
      for (NodeRef m : b.F.nodes) bo.insert(m.p);
      for (NodeRef m : b.combine_nodes()) bo.insert(m.p);
      if (!read_only_by(t, b.x1, bo) || !read_only_by(t, b.x2, bo)) break;
    }
    ch.link_kinds.push_back(*kind);
    ch.link_dims.push_back(d1);
    ch.link_dims.push_back(d2);
    link_nodes.insert(link_nodes.end(), ln.begin(), ln.end());
    ch.blocks.push_back(b);
  }
  return j;
}

// Why the chain cannot be cut out as it is (or ""): a function reads a value made
// inside the chain (it would not exist before the op), or the last block's y1 has a
// reader placed before its y2 (the op comes where y2 was made).
std::string chain_refusal(const Top& t, const CouplingChain& c) {
  const GraphView& g = t.g;
  const Coupling& last = c.blocks.back();
  std::vector<ValueRef> chain_in{c.blocks.front().x1, c.blocks.front().x2};
  size_t start = t.index(c.blocks.front().F.nodes.front());
  for (NodeRef m : c.blocks.front().combine_nodes()) start = std::min(start, t.index(m));
  const ValueSet inside = t.forward(chain_in, start, t.index(last.add2) + 1);
  std::string why;
  for (const Coupling& b : c.blocks)
    for (const CouplingFn* f : {&b.F, &b.G})
      for (ValueRef v : f->external)
        if (why.empty() && inside.count(v.p))
          why = "a function reads " + g.name(v) + ", which the chain makes";
  for (NodeRef u : t.users(last.y1))
    if (why.empty() && t.index(u) < t.index(last.add2) &&
        std::find(last.G.nodes.begin(), last.G.nodes.end(), u) == last.G.nodes.end())
      why = "its output " + g.name(last.y1) + " is read before " + g.name(last.y2) + " is made";
  return why;
}

// The chain's covers, in program order (its blocks' nodes and `link_nodes`), and
// what it guards: the inputs, the outputs and every external value.
void cover_chain(const Top& t, CouplingChain& c, const std::vector<NodeRef>& link_nodes) {
  const GraphView& g = t.g;
  const Coupling& last = c.blocks.back();
  for (const Coupling& b : c.blocks) {
    for (const CouplingFn* f : {&b.F, &b.G})
      c.covers.insert(c.covers.end(), f->nodes.begin(), f->nodes.end());
    for (NodeRef m : b.combine_nodes()) c.covers.push_back(m);
  }
  c.covers.insert(c.covers.end(), link_nodes.begin(), link_nodes.end());
  std::sort(c.covers.begin(), c.covers.end(),
            [&](NodeRef a, NodeRef b) { return t.index(a) < t.index(b); });
  c.guarded = {c.blocks.front().x1, c.blocks.front().x2, last.y1, last.y2};
  for (const Coupling& b : c.blocks)
    for (const CouplingFn* f : {&b.F, &b.G})
      for (ValueRef v : f->external)
        if (g.is_tensor(v)) c.guarded.push_back(v);
}

// The chain's decision: kept with `why` (see chain_refusal), for unknown sizes or too
// few bytes freed; else rewritten, priced by what it keeps before and after.
void price_chain(const Top& t, CouplingChain& c, const std::string& why, const CostPolicy& policy) {
  const GraphView& g = t.g;
  const Coupling& last = c.blocks.back();
  const auto before = kept_bytes(t, c.covers);
  const auto o1 = g.bytes(last.y1), o2 = g.bytes(last.y2);
  std::ostringstream text;
  const size_t k = c.blocks.size();
  size_t affine = 0;
  for (const Coupling& b : c.blocks)
    affine += b.combine1 != Combine::Add || b.combine2 != Combine::Add;
  if (affine == 0 || affine == k)
    text << k << " " << (affine ? "affine" : "additive") << " coupling" << (k == 1 ? "" : "s");
  else
    text << k << " couplings (" << affine << " affine)";
  if (!why.empty()) {
    c.decision.verdict = Decision::Verdict::Kept;
    c.decision.text = text.str() + ": " + why;
  } else if (!before || !o1 || !o2) {
    c.decision.verdict = Decision::Verdict::Kept;
    c.decision.text = text.str() + ": sizes unknown (run memslim.optimize with example inputs)";
  } else {
    c.kept_before = *before;
    c.kept_after = *o1 + *o2;
    c.decision.price.before = c.kept_before;
    c.decision.price.after = c.kept_after;
    c.decision.price.added_work = 1; // every F and G runs once more in backward
    if (c.kept_before - c.kept_after < std::max<int64_t>(policy.min_bytes, 1)) {
      c.decision.verdict = Decision::Verdict::Kept;
      text << ": frees " << (c.kept_before - c.kept_after) << " B (keeps " << c.kept_before
           << " B today, its outputs " << c.kept_after << " B)";
    } else {
      c.decision.verdict = Decision::Verdict::Rewrote;
      text << " -> " << kCouplingChainOp << ": keeps its 2 outputs (" << c.kept_after
           << " B) instead of " << c.kept_before << " B; F and G re-run in backward";
    }
    c.decision.text = text.str();
  }
}

} // namespace

const char* combine_name(Combine c) { return c == Combine::Add ? "additive" : "affine"; }

std::vector<NodeRef> Coupling::combine_nodes() const {
  std::vector<NodeRef> out{add1, add2};
  for (NodeRef n : {inner1, inner2})
    if (n) out.push_back(n);
  return out;
}

std::vector<CouplingChain> find_coupling_chains(const GraphView& g, const CostPolicy& policy) {
  const Top t(g);
  std::vector<CouplingChain> out;
  std::vector<CouplingChain> refused;
  std::unordered_set<const void*> taken;
  const std::vector<Coupling> found = find_couplings(t, refused, taken);
  // Refused readings whose nodes no coupling took (a Glow half's inner add,
  // refused as an additive half, is part of the coupling found at its mul).
  for (CouplingChain& r : refused) {
    bool part = false;
    for (NodeRef m : r.blocks.front().combine_nodes()) part = part || taken.count(m.p);
    if (!part) out.push_back(std::move(r));
  }
  // Chains: maximal runs of linked couplings whose inner values nobody else reads.
  for (size_t i = 0; i < found.size();) {
    CouplingChain ch;
    std::vector<NodeRef> link_nodes;
    i = extend_chain(t, found, i, ch, link_nodes);
    ch.decision.pass = kInvertibleCouplingsPass;
    ch.decision.site = "coupling at " + g.name(ch.blocks.back().y2);
    const std::string why = chain_refusal(t, ch);
    cover_chain(t, ch, link_nodes);
    price_chain(t, ch, why, policy);
    out.push_back(std::move(ch));
  }
  return out;
}

} // namespace memslim
