//===- canonicalize_norms.cpp - hand-written RMSNorm -> aten::rms_norm -----===//
//
// Matches the formula of canonicalize_norms.h over any GraphView.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/canonicalize_norms.h"

#include <sstream>
#include <unordered_set>

#include "memslim/core/canonicalize.h"
#include "memslim/core/output_saving.h"

namespace memslim {

namespace {

struct M {
  const GraphView& g;
  std::vector<NodeRef> nodes;

  NodeRef made_by(ValueRef v, const char* kind) const {
    const NodeRef n = g.producer(v);
    return n && g.kind(n) == kind ? n : NodeRef{};
  }
  std::optional<double> number(ValueRef v) const { return scalar_constant(g, v); }
  std::optional<std::vector<int64_t>> int_list(ValueRef v) const { return int_list_constant(g, v); }
  // v through casts that keep float32 (`.to(torch.float32)` of a float32 value).
  ValueRef uncast(ValueRef v) {
    while (const NodeRef n = made_by(v, "aten::to")) {
      const ValueRef in = g.input(n, 0);
      if (g.dtype(in) != c10::kFloat || g.dtype(v) != c10::kFloat) break;
      nodes.push_back(n);
      v = in;
    }
    return v;
  }
  // Whether `v` is h^2 (pow(h, 2) or h * h); sets h.
  bool square(ValueRef v, ValueRef& h) {
    if (const NodeRef p = made_by(v, "aten::pow")) {
      const auto e = number(g.input(p, 1));
      if (!e || *e != 2) return false;
      nodes.push_back(p);
      h = uncast(g.input(p, 0));
      return true;
    }
    if (const NodeRef p = made_by(v, "aten::mul")) {
      const ValueRef a = uncast(g.input(p, 0)), b = uncast(g.input(p, 1));
      if (a != b) return false;
      nodes.push_back(p);
      h = a;
      return true;
    }
    return false;
  }
  // Whether `r` is rsqrt(mean(h^2, [-1], keepdim=True) + eps); sets h, eps, mean.
  bool inv_rms(ValueRef r, ValueRef& h, double& eps, ValueRef& mean) {
    const NodeRef rs = made_by(r, "aten::rsqrt");
    if (!rs) return false;
    const NodeRef add = made_by(g.input(rs, 0), "aten::add");
    if (!add || g.num_inputs(add) < 2) return false;
    const auto e = number(g.input(add, 1));
    const auto alpha = g.num_inputs(add) > 2 ? number(g.input(add, 2)) : std::optional<double>(1);
    if (!e || !alpha || *alpha != 1) return false;
    const NodeRef mn = made_by(g.input(add, 0), "aten::mean");
    if (!mn || g.num_inputs(mn) < 3) return false;
    const auto dims = int_list(g.input(mn, 1));
    const auto keep = g.constant(g.input(mn, 2));
    if (!dims || *dims != std::vector<int64_t>{-1} || !keep || !keep->isBool() || !keep->toBool())
      return false;
    if (g.num_inputs(mn) > 3) { // dtype=None only
      const auto dt = g.constant(g.input(mn, 3));
      if (!dt || !dt->isNone()) return false;
    }
    if (!square(g.input(mn, 0), h)) return false;
    nodes.insert(nodes.end(), {mn, add, rs});
    eps = *e;
    mean = g.output(mn, 0);
    return true;
  }
};

} // namespace

std::optional<RmsNormMatch> match_rms_norm(const GraphView& g, NodeRef root) {
  if (g.kind(root) != "aten::mul" || g.num_inputs(root) != 2 || g.num_outputs(root) != 1)
    return std::nullopt;
  for (int w = 0; w < 2; ++w) {
    M m{g, {}};
    const ValueRef weight = g.input(root, w);
    // Through any cast here: a 16-bit result is a match the dtype rule keeps.
    ValueRef t = m.uncast(g.input(root, 1 - w));
    if (const NodeRef c = m.made_by(t, "aten::to")) {
      m.nodes.push_back(c);
      t = g.input(c, 0);
    }
    const NodeRef prod = m.made_by(t, "aten::mul");
    if (!prod || !g.is_tensor(weight)) continue;
    for (int r = 0; r < 2; ++r) {
      M mm{g, m.nodes};
      ValueRef h, mean;
      double eps = 0;
      const ValueRef h1 = mm.uncast(g.input(prod, 1 - r));
      if (!mm.inv_rms(g.input(prod, r), h, eps, mean) || h != h1) continue;
      RmsNormMatch out;
      out.root = root;
      out.x = h;
      out.weight = weight;
      out.eps = eps;
      // Once each, in graph order (a cast of x is reached from both sides).
      std::unordered_set<NodeRef, NodeRefHash> in(mm.nodes.begin(), mm.nodes.end());
      in.insert(prod);
      in.insert(root);
      for (NodeRef n : g.nodes())
        if (in.count(n)) out.covers.push_back(n);
      Decision& d = out.decision;
      d.pass = kCanonicalizeNormsPass;
      d.site = site_name(g, root);
      d.verdict = Decision::Verdict::Kept;
      const auto xn = g.numel(h), mn = g.numel(mean), wn = g.numel(weight),
                 yn = g.numel(g.output(root, 0));
      if (g.dtype(h) != c10::kFloat || g.dtype(g.output(root, 0)) != c10::kFloat ||
          g.dtype(weight) != c10::kFloat) {
        d.text =
            "RMSNorm formula not in float32 (in 16-bit it rounds twice where aten's "
            "rms_norm rounds once)";
        return out;
      }
      if (!xn || !mn || !wn || !yn || *mn == 0 || *xn % *mn != 0 || *xn / *mn != *wn ||
          *yn != *xn) {
        d.text = "unknown shape, or a weight that is not one per element of the last dim";
        return out;
      }
      out.dim = *xn / *mn;
      std::ostringstream why;
      why << "RMSNorm formula at " << g.name(g.output(root, 0)) << " -> aten::rms_norm (eps " << eps
          << ")";
      d.verdict = Decision::Verdict::Rewrote;
      d.text = why.str();
      return out;
    }
  }
  return std::nullopt;
}

} // namespace memslim
