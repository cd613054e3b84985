//===- canonicalize_activations.cpp - hand-written activations -> aten ops --===//
//
// What: recognises activations written out by hand and replaces them by the
// named aten op, so the rest of the pipeline sees one shape:
//   x * sigmoid(x)                                   -> aten::silu
//   x * tanh(softplus(x))          (beta 1, thr 20)  -> aten::mish
//   0.5 * x * (1 + erf(x / sqrt(2)))                 -> aten::gelu(x, "none")
//   0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))  -> aten::gelu(x, "tanh")
//   (x * relu6(x + 3)) / 6                           -> aten::hardswish
// How: a product is flattened into a scalar and its tensor factors (any order,
// any nesting of mul, and div by a constant); the inner arguments are read as
// polynomials in x (add, sub, mul, div, pow by constants), so commuted
// operands, x*x*x vs pow(x, 3) and pooled constants all match. Constants are
// compared by value with a relative tolerance of 1e-4. Each match is a
// proposal to the SafetyGate covering the whole formula, so an in-place write
// between its nodes (`s = sigmoid(h); h.add_(1); h * s`) keeps it as written.
// hardswish is matched only in aten's own order, (x * relu6(x + 3)) / 6: every
// other grouping (x * hardsigmoid(x), x * (relu6(x + 3) / 6), ...) equals x
// exactly for x >= 3 where aten's x * 6 / 6 does not, about one value in five
// there, and a program comparing the two (`where(hs > x, ...)`) flips (fuzz
// seed 210874, in fp32 and fp64 alike).
// The erf GELU is recognised but left as written: aten::gelu's CPU kernel is less
// accurate than the formula through torch.erf (measured over 4M fp32 points:
// for x in [-3, -1) a mean relative error against fp64 of 7.9e-6 in the output
// and 1.1e-6 in the gradient, the formula's 9.5e-7 and 2.2e-7; for x in
// [-10, -5) aten's gradient is off by 0.79 on average, the formula's by 0.013),
// and a steep function after it (a FracAct pow) turned that into a 1.7e-4
// gradient error (long-fuzz seed 314804). The region pass recomputes the
// formula as written instead. The tanh GELU, silu, mish and hardswish forms
// match aten's accuracy in every band (same measurement).
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/graph_iterator.h>

#include <cmath>
#include <map>
#include <optional>
#include <functional>
#include <set>
#include <unordered_map>

#include "memslim/passes/pass.h"
#include "memslim/passes/safety_gate.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

namespace {

constexpr const char* kPass = "canonicalize-activations";
constexpr double kTol = 1e-4;

bool near(double a, double b) { return std::fabs(a - b) <= kTol * std::max(std::fabs(b), 1e-12); }

std::optional<double> scalar_constant(Value* v) {
  auto iv = torch::jit::toIValue(v);
  if (!iv) return std::nullopt;
  if (iv->isDouble()) return iv->toDouble();
  if (iv->isInt()) return double(iv->toInt());
  if (iv->isTensor() && iv->toTensor().numel() == 1 && iv->toTensor().dim() == 0)
    return iv->toTensor().item<double>();
  return std::nullopt;
}

bool is(const Node* n, const char* kind) { return n->kind() == c10::Symbol::fromQualString(kind); }

// add/sub carry an `alpha` multiplier on the second operand.
std::optional<double> alpha_of(const Node* n) {
  if (n->inputs().size() < 3) return 1.0;
  return scalar_constant(n->input(2));
}

struct Product {
  double scale = 1;
  std::vector<Value*> factors;
};

void flatten_product(Value* v, Product& p, int depth = 0) {
  Node* n = v->node();
  if (depth < 8 && is(n, "aten::mul") && n->inputs().size() == 2) {
    auto c1 = scalar_constant(n->input(1)), c0 = scalar_constant(n->input(0));
    if (c1) { p.scale *= *c1; flatten_product(n->input(0), p, depth + 1); return; }
    if (c0) { p.scale *= *c0; flatten_product(n->input(1), p, depth + 1); return; }
    flatten_product(n->input(0), p, depth + 1);
    flatten_product(n->input(1), p, depth + 1);
    return;
  }
  if (depth < 8 && is(n, "aten::div") && n->inputs().size() == 2) {
    if (auto c = scalar_constant(n->input(1)); c && *c != 0) {
      p.scale /= *c;
      flatten_product(n->input(0), p, depth + 1);
      return;
    }
  }
  p.factors.push_back(v);
}

using Poly = std::map<int, double>;  // degree -> coefficient

Poly mul(const Poly& a, const Poly& b) {
  Poly r;
  for (auto [da, ca] : a)
    for (auto [db, cb] : b) r[da + db] += ca * cb;
  return r;
}

// v as a polynomial in x of degree <= 4, or nullopt.
std::optional<Poly> poly(Value* v, Value* x, int depth = 0) {
  if (v == x) return Poly{{1, 1.0}};
  if (auto c = scalar_constant(v)) return Poly{{0, *c}};
  if (depth > 10) return std::nullopt;
  Node* n = v->node();
  auto sub = [&](size_t i) { return poly(n->input(i), x, depth + 1); };
  if (is(n, "aten::mul") && n->inputs().size() == 2) {
    auto a = sub(0), b = sub(1);
    if (!a || !b) return std::nullopt;
    Poly r = mul(*a, *b);
    if (!r.empty() && r.rbegin()->first > 4) return std::nullopt;
    return r;
  }
  if (is(n, "aten::div") && n->inputs().size() == 2) {
    auto c = scalar_constant(n->input(1));
    auto a = sub(0);
    if (!c || *c == 0 || !a) return std::nullopt;
    for (auto& [d, k] : *a) k /= *c;
    return a;
  }
  if ((is(n, "aten::add") || is(n, "aten::sub")) && n->inputs().size() >= 2) {
    auto a = sub(0), b = sub(1);
    auto alpha = alpha_of(n);
    if (!a || !b || !alpha) return std::nullopt;
    const double sign = is(n, "aten::sub") ? -*alpha : *alpha;
    for (auto [d, k] : *b) (*a)[d] += sign * k;
    return a;
  }
  if (is(n, "aten::pow") && n->inputs().size() == 2) {
    auto e = scalar_constant(n->input(1));
    auto a = sub(0);
    if (!e || !a || *e != std::floor(*e) || *e < 1 || *e > 4) return std::nullopt;
    Poly r = *a;
    for (int i = 1; i < int(*e); ++i) r = mul(r, *a);
    return r;
  }
  return std::nullopt;
}

bool poly_is(const std::optional<Poly>& p, const Poly& want) {
  if (!p) return false;
  for (auto [d, k] : *p)
    if (!want.count(d) && std::fabs(k) > 1e-12) return false;
  for (auto [d, k] : want) {
    auto it = p->find(d);
    if (it == p->end() || !near(it->second, k)) return false;
  }
  return true;
}

// `v` = 1 + t (as add(t, 1) or add(1-valued, t)): returns t.
Value* one_plus(Value* v) {
  Node* n = v->node();
  if (!is(n, "aten::add") || n->inputs().size() < 2) return nullptr;
  auto alpha = alpha_of(n);
  if (!alpha || *alpha != 1.0) return nullptr;
  if (auto c = scalar_constant(n->input(1)); c && near(*c, 1.0)) return n->input(0);
  if (auto c = scalar_constant(n->input(0)); c && near(*c, 1.0)) return n->input(1);
  return nullptr;
}

struct Match {
  const char* op;          // aten op to create
  const char* approximate; // gelu only
  const char* form;        // for the remark
  const char* keep = nullptr; // why the form stays as written (a remark), or null
};

// Is `root` computed as aten's hardswish computes it: div(mul(x, g), 6)?
bool in_aten_hardswish_order(Node* root, Value* x, Value* g) {
  if (!is(root, "aten::div")) return false;
  auto c = scalar_constant(root->input(1));
  Node* m = root->input(0)->node();
  if (!c || *c != 6.0 || !is(m, "aten::mul") || m->inputs().size() != 2) return false;
  return (m->input(0) == x && m->input(1) == g) || (m->input(0) == g && m->input(1) == x);
}

// Is `g` (the factor other than x) with the product's `scale`, at `root`, an
// activation of x?
std::optional<Match> recognise(Node* root, Value* x, Value* g, double scale) {
  Node* n = g->node();
  if (near(scale, 1.0)) {
    if (is(n, "aten::sigmoid") && n->input(0) == x)
      return Match{"aten::silu", nullptr, "x * sigmoid(x)"};
    if (is(n, "aten::tanh")) {
      Node* sp = n->input(0)->node();
      if (is(sp, "aten::softplus") && sp->input(0) == x) {
        auto beta = scalar_constant(sp->input(1)), th = scalar_constant(sp->input(2));
        if (beta && th && near(*beta, 1.0) && near(*th, 20.0))
          return Match{"aten::mish", nullptr, "x * tanh(softplus(x))"};
      }
    }
  }
  if (near(scale, 1.0 / 6.0)) {
    const bool relu6 = is(n, "aten::relu6");
    bool hardtanh06 = false;
    if (is(n, "aten::hardtanh") && n->inputs().size() == 3) {
      auto lo = scalar_constant(n->input(1)), hi = scalar_constant(n->input(2));
      hardtanh06 = lo && hi && *lo == 0.0 && *hi == 6.0;
    }
    if ((relu6 || hardtanh06) && poly_is(poly(n->input(0), x), Poly{{0, 3.0}, {1, 1.0}}) &&
        in_aten_hardswish_order(root, x, g))
      return Match{"aten::hardswish", nullptr, "x * relu6(x + 3) / 6"};
  }
  if (near(scale, 0.5)) {
    if (Value* t = one_plus(g)) {
      Node* tn = t->node();
      if (is(tn, "aten::erf") && poly_is(poly(tn->input(0), x), Poly{{1, M_SQRT1_2}}))
        return Match{"aten::gelu", "none", "0.5 * x * (1 + erf(x / sqrt(2)))",
                     "aten::gelu is less accurate than this formula on the CPU (fp32 x < -1)"};
      const double k = std::sqrt(2.0 / M_PI);
      if (is(tn, "aten::tanh") &&
          poly_is(poly(tn->input(0), x), Poly{{1, k}, {3, k * 0.044715}}))
        return Match{"aten::gelu", "tanh", "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))"};
    }
  }
  return std::nullopt;
}

// The nodes of a matched formula: every node between `x` and `root` (those
// `root` reaches through its inputs that depend on x; constants excluded).
std::vector<Node*> formula_nodes(Node* root, Value* x) {
  std::vector<Node*> out;
  std::unordered_map<Node*, bool> memo;
  std::function<bool(Node*)> depends = [&](Node* n) -> bool {
    auto it = memo.find(n);
    if (it != memo.end()) return it->second;
    memo[n] = false;
    bool d = false;
    for (Value* v : n->inputs()) {
      const c10::Symbol k = v->node()->kind();
      if (v == x) d = true;
      else if (k != c10::prim::Constant && k != c10::prim::Param && depends(v->node())) d = true;
    }
    memo[n] = d;
    if (d) out.push_back(n);
    return d;
  };
  depends(root);
  return out;
}

} // namespace

void run_canonicalize_activations(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  std::vector<Node*> roots;
  std::shared_ptr<torch::jit::Graph> gm = g;
  torch::jit::DepthFirstGraphNodeIterator it(gm);  // every block
  for (Node* n = it.next(); n; n = it.next())
    if ((is(n, "aten::mul") || is(n, "aten::div")) && n->inputs().size() == 2) roots.push_back(n);
  // Outermost products first (reverse order): an inner mul of a matched
  // expression is then dead and never matched on its own.
  for (auto it = roots.rbegin(); it != roots.rend(); ++it) {
    Node* root = *it;
    if (!ctx.gate->alive(root)) continue;
    Product p;
    flatten_product(root->output(), p);
    if (p.factors.size() != 2) continue;
    for (int i = 0; i < 2; ++i) {
      Value* x = p.factors[i];
      Value* other = p.factors[1 - i];
      auto m = recognise(root, x, other, p.scale);
      if (!m) continue;
      const std::string form = std::string(m->form) + " at %" + root->output()->debugName();
      if (m->keep) {
        ctx.remarks.kept(kPass, form, m->keep);
        break;
      }
      Proposal prop;
      prop.site = form;
      prop.covers = formula_nodes(root, x);
      // The aten op keeps its input, as the formula's mul did; under TorchScript's
      // executor a DifferentiableGraph may keep its output (hardswish: measured by
      // the fuzzer), which the formula never kept: a later write to either keeps it.
      prop.guarded = {x, root->output()};
      prop.makes = {{c10::Symbol::fromQualString(m->op), x}};
      const Match match = *m;
      prop.apply = [&g, root, x, match]() {
        std::vector<Value*> args{x};
        if (match.approximate) {
          torch::jit::WithInsertPoint guard(root);
          args.push_back(g->insertConstant(std::string(match.approximate)));
        }
        replace_output(*g, root, root->output(), c10::Symbol::fromQualString(match.op), args);
        return std::string();
      };
      prop.rewrote = form + " -> " + m->op +
                     (m->approximate ? std::string("(\"") + m->approximate + "\")" : "");
      ctx.gate->submit(prop);
      break;
    }
  }
}

} // namespace memslim
