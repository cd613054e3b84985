//===- canonicalize_norms.cpp - hand-written RMSNorm / LayerNorm -> aten ----===//
//
// Matches the formulas of canonicalize_norms.h over any GraphView.
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
  // Whether `mn` is mean(., [-1], keepdim=True) (dtype None).
  bool last_dim_mean(NodeRef mn) const {
    if (g.num_inputs(mn) < 3) return false;
    const auto dims = int_list(g.input(mn, 1));
    const auto keep = g.constant(g.input(mn, 2));
    if (!dims || *dims != std::vector<int64_t>{-1} || !keep || !keep->isBool() || !keep->toBool())
      return false;
    if (g.num_inputs(mn) > 3) { // dtype=None only
      const auto dt = g.constant(g.input(mn, 3));
      if (!dt || !dt->isNone()) return false;
    }
    return true;
  }
  // Whether `v` is s + eps (add with alpha 1 and a constant number, a 0-dim
  // tensor constant as a trace records it included, or a non-tensor value such
  // as a scripted module's float attribute); sets s, eps / eps_value.
  bool plus_eps(ValueRef v, ValueRef& s, double& eps, ValueRef& eps_value) {
    const NodeRef add = made_by(v, "aten::add");
    if (!add || g.num_inputs(add) < 2) return false;
    const ValueRef in = g.input(add, 1);
    const auto e = number(in);
    const auto alpha = g.num_inputs(add) > 2 ? number(g.input(add, 2)) : std::optional<double>(1);
    if (!alpha || *alpha != 1) return false;
    if (!e && (g.is_tensor(in) || g.constant(in))) return false; // no number
    nodes.push_back(add);
    s = g.input(add, 0);
    eps = e.value_or(0);
    eps_value = e ? ValueRef{} : g.input(add, 1);
    return true;
  }
  // Whether `d` is x - u (alpha 1) with u the value `mean` or another
  // mean(x, [-1], keepdim=True) (a formula that writes x.mean() twice).
  bool centred(ValueRef d, ValueRef x, ValueRef mean) {
    const NodeRef sub = made_by(d, "aten::sub");
    if (!sub || g.num_inputs(sub) < 2) return false;
    const auto alpha = g.num_inputs(sub) > 2 ? number(g.input(sub, 2)) : std::optional<double>(1);
    if (!alpha || *alpha != 1 || uncast(g.input(sub, 0)) != x) return false;
    if (g.input(sub, 1) != mean) {
      const NodeRef mn = made_by(g.input(sub, 1), "aten::mean");
      if (!mn || !last_dim_mean(mn) || uncast(g.input(mn, 0)) != x) return false;
      nodes.push_back(mn);
    }
    nodes.push_back(sub);
    return true;
  }
  // Whether `s` is the biased variance of x over the last dim: mean(d^2) with
  // d = x - mean (the numerator's or its own subtraction: torch.export does not
  // merge the two a formula writes), or var(x, [-1], unbiased=False /
  // correction=0, keepdim).
  bool variance(ValueRef s, ValueRef x, ValueRef d, ValueRef mean) {
    if (const NodeRef mn = made_by(s, "aten::mean")) {
      ValueRef h;
      if (!last_dim_mean(mn) || !square(g.input(mn, 0), h)) return false;
      if (h != d && !centred(h, x, mean)) return false;
      nodes.push_back(mn);
      return true;
    }
    const NodeRef v = made_by(s, "aten::var");
    if (!v || g.num_inputs(v) != 4 || uncast(g.input(v, 0)) != x) return false;
    const auto dims = int_list(g.input(v, 1));
    const auto biased = g.constant(g.input(v, 2)); // unbiased: bool; correction: a number
    const auto keep = g.constant(g.input(v, 3));
    if (!dims || *dims != std::vector<int64_t>{-1} || !keep || !keep->isBool() || !keep->toBool() ||
        !biased)
      return false;
    if (!(biased->isBool() && !biased->toBool()) && !(biased->isInt() && biased->toInt() == 0) &&
        !(biased->isDouble() && biased->toDouble() == 0))
      return false;
    nodes.push_back(v);
    return true;
  }
  // Whether `n` is (x - mean(x)) * rsqrt(var + eps) or (x - mean(x)) /
  // sqrt(var + eps), over the last dim; sets x, mean, eps / eps_value.
  bool normalized(ValueRef n, ValueRef& x, ValueRef& mean, ValueRef& d, double& eps,
                  ValueRef& eps_value) {
    ValueRef den;
    const char* root = nullptr;
    NodeRef top = made_by(n, "aten::mul");
    if (!top) top = made_by(n, "aten::div");
    if (!top || g.num_inputs(top) != 2) return false;
    if (g.kind(top) == "aten::div") {
      d = g.input(top, 0);
      den = g.input(top, 1);
      root = "aten::sqrt";
    } else {
      root = "aten::rsqrt";
      const bool first = static_cast<bool>(made_by(g.input(top, 0), root));
      den = g.input(top, first ? 0 : 1);
      d = g.input(top, first ? 1 : 0);
    }
    const NodeRef r = made_by(den, root);
    const NodeRef sub = made_by(d, "aten::sub");
    if (!r || !sub || g.num_inputs(sub) < 2) return false;
    const auto alpha = g.num_inputs(sub) > 2 ? number(g.input(sub, 2)) : std::optional<double>(1);
    const NodeRef mn = made_by(g.input(sub, 1), "aten::mean");
    if (!alpha || *alpha != 1 || !mn || !last_dim_mean(mn)) return false;
    x = uncast(g.input(sub, 0));
    if (uncast(g.input(mn, 0)) != x) return false;
    ValueRef s;
    mean = g.output(mn, 0);
    if (!plus_eps(g.input(r, 0), s, eps, eps_value) || !variance(s, x, d, mean)) return false;
    nodes.insert(nodes.end(), {mn, sub, r, top});
    return true;
  }
  // Whether `r` is rsqrt(mean(h^2, [-1], keepdim=True) + eps); sets h, eps, mean.
  bool inv_rms(ValueRef r, ValueRef& h, double& eps, ValueRef& mean) {
    const NodeRef rs = made_by(r, "aten::rsqrt");
    if (!rs) return false;
    ValueRef s, eps_value;
    if (!plus_eps(g.input(rs, 0), s, eps, eps_value) || eps_value) return false; // a constant
    const NodeRef mn = made_by(s, "aten::mean");
    if (!mn || !last_dim_mean(mn) || !square(g.input(mn, 0), h)) return false;
    nodes.insert(nodes.end(), {mn, rs});
    mean = g.output(mn, 0);
    return true;
  }
};

} // namespace

// The formula's nodes once each, in graph order (a cast of x is reached from
// several sides).
std::vector<NodeRef> in_graph_order(const GraphView& g, const std::vector<NodeRef>& nodes) {
  std::unordered_set<NodeRef, NodeRefHash> in(nodes.begin(), nodes.end());
  std::vector<NodeRef> out;
  for (NodeRef n : g.nodes())
    if (in.count(n)) out.push_back(n);
  return out;
}

std::optional<NormMatch> match_rms_norm(const GraphView& g, NodeRef root) {
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
      NormMatch out;
      out.op = "aten::rms_norm";
      out.root = root;
      out.x = h;
      out.weight = weight;
      out.eps = eps;
      mm.nodes.insert(mm.nodes.end(), {prod, root});
      out.covers = in_graph_order(g, mm.nodes);
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
          *yn != *xn || g.rank(weight).value_or(1) != 1) {
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

std::optional<NormMatch> match_layer_norm(const GraphView& g, NodeRef root) {
  const std::string k = g.kind(root);
  if ((k != "aten::add" && k != "aten::mul" && k != "aten::div") || g.num_outputs(root) != 1)
    return std::nullopt;
  const ValueRef y = g.output(root, 0);
  // Each reading of the root: (weight, bias, normalised value) candidates.
  struct Try {
    ValueRef weight, bias, n;
    std::vector<NodeRef> affine;
  };
  std::vector<Try> tries;
  M probe{g, {}};
  if (k == "aten::add" && g.num_inputs(root) >= 2) {
    const auto alpha =
        g.num_inputs(root) > 2 ? probe.number(g.input(root, 2)) : std::optional<double>(1);
    if (alpha && *alpha == 1)
      for (int b = 0; b < 2; ++b) {
        const ValueRef bias = g.input(root, b), m = g.input(root, 1 - b);
        if (!g.is_tensor(bias)) continue;
        tries.push_back({ValueRef{}, bias, m, {root}}); // bias only
        if (const NodeRef mul = probe.made_by(m, "aten::mul"); mul && g.num_inputs(mul) == 2)
          for (int w = 0; w < 2; ++w)
            tries.push_back({g.input(mul, w), bias, g.input(mul, 1 - w), {mul, root}});
      }
  }
  if (k == "aten::mul" && g.num_inputs(root) == 2)
    for (int w = 0; w < 2; ++w)
      tries.push_back({g.input(root, w), ValueRef{}, g.input(root, 1 - w), {root}});
  if (k != "aten::add") tries.push_back({ValueRef{}, ValueRef{}, y, {}}); // no affine
  for (const Try& t : tries) {
    if (t.weight && !g.is_tensor(t.weight)) continue;
    M m{g, {}};
    ValueRef x, mean, centred, eps_value;
    double eps = 0;
    if (!m.normalized(t.n, x, mean, centred, eps, eps_value)) continue;
    NormMatch out;
    out.eps_value = eps_value;
    out.op = "aten::layer_norm";
    out.root = root;
    out.x = centred;
    out.weight = t.weight;
    out.bias = t.bias;
    out.eps = eps;
    m.nodes.insert(m.nodes.end(), t.affine.begin(), t.affine.end());
    // The centring x - mean(x) (and the casts it reads) stays as written:
    // layer_norm takes its result.
    std::unordered_set<NodeRef, NodeRefHash> keep;
    std::vector<ValueRef> todo{centred};
    const std::unordered_set<NodeRef, NodeRefHash> formula(m.nodes.begin(), m.nodes.end());
    while (!todo.empty()) {
      const NodeRef p = g.producer(todo.back());
      todo.pop_back();
      if (!p || !formula.count(p) || !keep.insert(p).second) continue;
      for (size_t i = 0; i < g.num_inputs(p); ++i) todo.push_back(g.input(p, i));
    }
    std::vector<NodeRef> covered;
    for (NodeRef n : m.nodes)
      if (!keep.count(n)) covered.push_back(n);
    out.covers = in_graph_order(g, covered);
    Decision& d = out.decision;
    d.pass = kCanonicalizeNormsPass;
    d.site = site_name(g, root);
    d.verdict = Decision::Verdict::Kept;
    bool fp32 = g.dtype(x) == c10::kFloat && g.dtype(y) == c10::kFloat;
    for (ValueRef p : {t.weight, t.bias})
      if (p) fp32 = fp32 && g.dtype(p) == c10::kFloat;
    if (!fp32) {
      d.text = "LayerNorm formula not in float32 (aten's layer_norm rounds it otherwise)";
      return out;
    }
    if (!g.contiguous(x).value_or(false)) {
      // The formula's pointwise ops give x's layout, aten's layer_norm a
      // contiguous output: a dropout after it would lay its mask out otherwise
      // (fuzz seed 511694: a LayerNorm of x.t() before nn.Dropout).
      d.text =
          "input not known to be contiguous (aten's layer_norm would change the output's "
          "layout, and with it where a later dropout puts its mask)";
      return out;
    }
    const auto xn = g.numel(x), mn = g.numel(mean), yn = g.numel(y);
    bool shapes = xn && mn && yn && *mn > 0 && *xn % *mn == 0 && *yn == *xn;
    const int64_t D = shapes ? *xn / *mn : 0;
    for (ValueRef p : {t.weight, t.bias})
      if (p) shapes = shapes && g.numel(p) == D && g.rank(p) == 1;
    if (!shapes) {
      d.text = "unknown shape, or a weight / bias that is not one vector of the last dim's size";
      return out;
    }
    out.dim = D;
    std::ostringstream why;
    why << "LayerNorm formula at " << g.name(y) << " -> aten::layer_norm (eps ";
    if (eps_value)
      why << g.name(eps_value);
    else
      why << eps;
    why << (t.weight ? "" : ", no weight") << (t.bias ? "" : ", no bias") << ")";
    d.verdict = Decision::Verdict::Rewrote;
    d.text = why.str();
    return out;
  }
  return std::nullopt;
}

} // namespace memslim
