//===- verify.cpp - --verify: the rewritten graph against the input -------===//
//
// What: run_with_grads (a graph run with autograd, the loss a fixed random
// weighting of its floating outputs) and verify: the input graph and the
// rewritten one on the same inputs and RNG seed, every output and gradient
// compared by relative L2 (bar 1e-4; non-finite values position by position).
// A tensor past the bar passes only when the input graph is that far from
// exact itself (judged against a float64 run, see judge_by_float64). Graphs
// torch's interpreter cannot run as written are compared loop-unrolled.
// Why: the fuzzers and users rely on `--verify` as the rewrite's proof; the
// float64 rule is the fuzzer judge's own (test/fuzz/runner.py).
//
//===----------------------------------------------------------------------===//
#include "verify.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/passes/loop_unrolling.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/script.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>

#include "memslim/jit/graph_iterator.h"
#include "support.h"

namespace memslim_opt {

using torch::jit::Graph;

namespace {

constexpr uint64_t kVerifySeed = 20240905;

// Tensors and other leaves of an output, depth first through tuples, lists, dicts.
void flatten(const c10::IValue& v, std::vector<c10::IValue>& out) {
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) flatten(e, out);
  } else if (v.isList()) {
    for (const c10::IValue e : v.toListRef()) flatten(e, out);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) {
      out.push_back(kv.key());
      flatten(kv.value(), out);
    }
  } else {
    out.push_back(v);
  }
}

} // namespace

// Runs `graph` on `prefix` + `ex` with autograd (the RNG seeded the same way
// for every call), returning the flattened outputs and
// d(sum_i <w_i, out_i>)/d(inputs that require grad, params).
RunResult run_with_grads(const std::shared_ptr<Graph>& graph,
                         const std::vector<c10::IValue>& prefix, const Example& ex,
                         const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> leaves;
  torch::jit::Stack stack(prefix.begin(), prefix.end());
  for (size_t i = 0; i < ex.values.size(); ++i) {
    if (ex.values[i].isTensor()) {
      at::Tensor t = ex.values[i].toTensor().detach().clone();
      if (ex.requires_grad[i]) {
        t.requires_grad_(true);
        leaves.push_back(t);
      }
      stack.emplace_back(t);
    } else {
      stack.push_back(ex.values[i]);
    }
  }
  torch::jit::Code code(graph, "memslim_verify");
  at::manual_seed(kVerifySeed);
  torch::jit::InterpreterState(code).run(stack);
  std::vector<c10::IValue> flat;
  for (const auto& v : stack) flatten(v, flat);
  RunResult r;
  at::Tensor loss;
  at::manual_seed(1);
  for (const auto& v : flat) {
    if (!v.isTensor()) {
      r.outputs.push_back(v);
      continue;
    }
    const at::Tensor& t = v.toTensor();
    r.outputs.emplace_back(t.detach());
    if (!at::isFloatingType(t.scalar_type())) continue;
    // Weights drawn in float whatever the output's dtype: the fp64 reference
    // run (see verify) weighs its outputs exactly as the run it checks. Drawn
    // for every floating output, so that each output's weight is the same in
    // both runs when one marks an output as requiring grad and the other does
    // not (a recompute region's outputs all require grad; long-fuzz seed
    // 107971: `zeros_like(x) ** 2` in a region shifted the next weights).
    at::Tensor w = at::randn(t.sizes(), t.options().dtype(at::kFloat)).to(t.scalar_type());
    if (!t.requires_grad()) continue;
    at::Tensor term = (t * w).sum();
    loss = loss.defined() ? loss + term : term;
  }
  std::vector<at::Tensor> wrt = leaves;
  wrt.insert(wrt.end(), params.begin(), params.end());
  r.grads.resize(wrt.size());
  if (loss.defined() && !wrt.empty()) {
    auto gs = torch::autograd::grad({loss}, wrt, {}, std::nullopt, false, true);
    for (size_t i = 0; i < gs.size() && i < r.grads.size(); ++i) r.grads[i] = gs[i];
  }
  return r;
}

namespace {

// L2 distance and the reference's L2 norm over the finite positions; a
// difference in where the non-finite values are (or in their values) is
// reported in `problem`.
std::pair<double, double> compare(const at::Tensor& a, const at::Tensor& b, const std::string& what,
                                  std::string& problem) {
  if (!problem.empty()) return {0, 0};
  if (a.sizes() != b.sizes()) {
    problem = what + ": shape " + c10::str(a.sizes()) + " vs " + c10::str(b.sizes());
    return {0, 0};
  }
  if (a.scalar_type() != b.scalar_type()) {
    problem = what + ": dtype " + std::string(c10::toString(a.scalar_type())) + " vs " +
              c10::toString(b.scalar_type());
    return {0, 0};
  }
  const bool cplx = at::isComplexType(a.scalar_type());
  at::Tensor x = a.to(at::kCPU).to(cplx ? at::kComplexDouble : at::kDouble);
  at::Tensor y = b.to(at::kCPU).to(cplx ? at::kComplexDouble : at::kDouble);
  if (x.numel() == 0) return {0, 0};
  at::Tensor fx = at::isfinite(x), fy = at::isfinite(y);
  if (!at::equal(fx, fy) || !at::equal(at::isnan(x), at::isnan(y))) {
    problem = what + ": non-finite values at different positions";
    return {0, 0};
  }
  at::Tensor inf = at::logical_and(at::logical_not(fx), at::logical_not(at::isnan(x)));
  if (inf.any().item<bool>() && !at::equal(x.masked_select(inf), y.masked_select(inf))) {
    problem = what + ": infinities of different sign";
    return {0, 0};
  }
  x = at::where(fx, x, at::zeros_like(x));
  y = at::where(fy, y, at::zeros_like(y));
  return {(x - y).norm().item<double>(), x.norm().item<double>()};
}

// Per (distance, norm) pair, the relative L2 distance. A norm below 1e-3 of
// the set's largest counts as 1e-3 of it: a gradient that is zero up to
// rounding (a bias before BatchNorm) is compared at that scale instead of
// relative to its own noise.
std::vector<double> relative_each(const std::vector<std::pair<double, double>>& d) {
  double scale = 0;
  for (const auto& [diff, norm] : d) scale = std::max(scale, norm);
  std::vector<double> rel;
  for (const auto& [diff, norm] : d) {
    const double denom = std::max(norm, 1e-3 * scale);
    rel.push_back(diff == 0 ? 0 : diff / (denom > 0 ? denom : 1.0));
  }
  return rel;
}

// The worst of relative_each, and where it is.
std::pair<double, size_t> worst_relative(const std::vector<std::pair<double, double>>& d) {
  const std::vector<double> rel = relative_each(d);
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < rel.size(); ++i)
    if (!(rel[i] <= worst)) {
      worst = rel[i];
      at = i;
    }
  return {worst, at};
}

} // namespace

std::shared_ptr<Graph> without_warnings(const std::shared_ptr<Graph>& g) {
  std::shared_ptr<Graph> copy = g->copy();
  std::vector<torch::jit::Node*> warns;
  torch::jit::DepthFirstGraphNodeIterator it(copy);
  for (auto* n = it.next(); n; n = it.next())
    if (n->kind() == c10::aten::warn && n->outputs().empty()) warns.push_back(n);
  for (auto* n : warns) n->destroy();
  return copy;
}

namespace {

// Per tensor, the relative L2 distances (relative_each) of
// `x` (outputs then gradients) from the float64 reference.
std::vector<double> distances_from(const RunResult& x, const RunResult& ref) {
  std::vector<std::pair<double, double>> outs, grads;
  std::string problem;
  auto as_double = [](const at::Tensor& t) { return t.to(at::kCPU).to(at::kDouble); };
  for (size_t i = 0; i < x.outputs.size() && i < ref.outputs.size(); ++i)
    if (x.outputs[i].isTensor() && ref.outputs[i].isTensor() &&
        at::isFloatingType(x.outputs[i].toTensor().scalar_type()))
      outs.push_back(compare(as_double(ref.outputs[i].toTensor()),
                             as_double(x.outputs[i].toTensor()), "", problem));
  for (size_t i = 0; i < x.grads.size() && i < ref.grads.size(); ++i) {
    at::Tensor g = x.grads[i], r = ref.grads[i];
    if (!g.defined() && !r.defined()) continue;
    if (!g.defined()) g = at::zeros_like(r);
    if (!r.defined()) r = at::zeros_like(g);
    grads.push_back(compare(as_double(r), as_double(g), "", problem));
  }
  if (!problem.empty()) return {};
  std::vector<double> rel = relative_each(outs), g = relative_each(grads);
  rel.insert(rel.end(), g.begin(), g.end());
  return rel;
}

// Runs before and after (`reset` before each run). torch's interpreter fails on
// some graphs the executor runs (it unrolls loops first): `x - v` after a loop
// that reads x, then a dropout, or a loop's output into a recompute region
// (long-fuzz seed 144414): "Expected Tensor but got None";
// torch.jit.optimized_execution(False) fails the same way. Unrolling is exact:
// where either graph fails as written, both are compared unrolled.
void run_both(const std::shared_ptr<Graph>& before, const std::shared_ptr<Graph>& after,
              const std::vector<c10::IValue>& prefix, const Example& ex,
              const std::vector<at::Tensor>& params, const std::function<void()>& reset,
              RunResult& r1, RunResult& r2) {
  auto run = [&](const std::shared_ptr<Graph>& g, bool unroll) {
    if (reset) reset();
    std::shared_ptr<Graph> h = g;
    if (unroll) {
      h = g->copy();
      torch::jit::UnrollLoops(h);
    }
    return run_with_grads(h, prefix, ex, params);
  };
  bool unrolled = false;
  try {
    r1 = run(before, false);
  } catch (const std::exception& e) {
    try {
      r1 = run(before, true);
      unrolled = true;
    } catch (const std::exception&) {
      fail("--verify: the input graph fails on the example inputs: " + one_line(e));
    }
  }
  try {
    r2 = run(after, unrolled);
  } catch (const std::exception& e) {
    bool ok = false;
    if (!unrolled) {
      try {
        RunResult u1 = run(before, true);
        r2 = run(after, true);
        r1 = std::move(u1);
        ok = true;
      } catch (const std::exception&) {
      }
    }
    if (!ok) fail("--verify: the rewritten graph fails (the input graph does not): " + one_line(e));
  }
}

// The (distance, norm) pairs of r2 against r1, outputs into `outs` and
// gradients into `grads`; fails on a difference no distance measures (number,
// shape, dtype, kind of an output; where the non-finite values are).
void direct_distances(const RunResult& r1, const RunResult& r2,
                      std::vector<std::pair<double, double>>& outs,
                      std::vector<std::pair<double, double>>& grads) {
  std::string problem;
  if (r1.outputs.size() != r2.outputs.size()) fail("verify failed: outputs differ in number");
  for (size_t i = 0; i < r1.outputs.size() && problem.empty(); ++i) {
    const auto &a = r1.outputs[i], &b = r2.outputs[i];
    const std::string what = "output " + std::to_string(i);
    if (a.isTensor() != b.isTensor())
      problem = what + ": tensor vs non-tensor";
    else if (a.isTensor())
      outs.push_back(compare(a.toTensor(), b.toTensor(), what, problem));
    else if (a.isDouble() && b.isDouble()) {
      const double x = a.toDouble(), y = b.toDouble();
      if (std::isnan(x) != std::isnan(y) || (!std::isfinite(x) && !std::isnan(x) && x != y))
        problem = what + ": " + c10::str(a) + " vs " + c10::str(b);
      else if (std::isfinite(x))
        outs.emplace_back(std::abs(x - y), std::abs(x));
    } else if (!(a == b)) {
      problem = what + ": " + c10::str(a) + " vs " + c10::str(b);
    }
  }
  for (size_t i = 0; i < r1.grads.size() && problem.empty(); ++i) {
    at::Tensor g1 = r1.grads[i], g2 = r2.grads[i];
    if (!g1.defined() && !g2.defined()) continue;
    if (!g1.defined()) g1 = at::zeros_like(g2);
    if (!g2.defined()) g2 = at::zeros_like(g1);
    grads.push_back(compare(g1, g2, "gradient " + std::to_string(i), problem));
  }
  if (!problem.empty()) fail("verify failed: " + problem);
}

// Where some tensor of r2 is more than 1e-4 from r1's: fails with `why` unless
// every such tensor passes the float64 rule (see verify), and returns what the
// ok line adds then. A float64 run (of the input graph, or of the rewritten
// one) puts module state back around it.
std::string judge_by_float64(const RunResult& r1, const RunResult& r2,
                             const std::vector<std::pair<double, double>>& outs,
                             const std::vector<std::pair<double, double>>& grads,
                             const std::string& why, const std::function<void()>& reset,
                             const Reference& reference) {
  auto run64 = [&](bool rewritten) -> std::optional<RunResult> {
    if (!reference) return std::nullopt;
    if (reset) reset();
    std::optional<RunResult> r;
    try {
      r = reference(rewritten);
    } catch (const std::exception&) {
      r.reset();
    }
    if (reset) reset();
    return r;
  };
  const std::optional<RunResult> ref = run64(false);
  if (!ref) fail(why);
  // Per tensor, in the order of outs then grads.
  std::vector<double> direct = relative_each(outs), direct_grads = relative_each(grads);
  direct.insert(direct.end(), direct_grads.begin(), direct_grads.end());
  const std::vector<double> d = distances_from(r1, *ref), e = distances_from(r2, *ref);
  if (d.size() != direct.size() || e.size() != direct.size()) fail(why);
  double own = 0, worst_e = 0, same_function = 0;
  std::optional<RunResult> twin64;
  std::vector<double> twin_d;
  for (size_t i = 0; i < direct.size(); ++i) {
    if (direct[i] <= 1e-4) continue;
    if (!(d[i] <= 1e-3)) {
      // The input graph's float32 result is more than 1e-3 from its float64
      // one (a where() or comparison takes other branches, or rounding
      // cancels): no reference. The tensor passes when both graphs run in
      // float64 agree within 1e-9 (the same function; long-fuzz seed 181052:
      // a fractional activation's parameter gradient, 1.7e-4 apart in
      // float32, 1e-14 in float64) and float32 stays within 1e-3.
      if (!twin64) {
        twin64 = run64(true);
        if (twin64) twin_d = distances_from(*twin64, *ref);
      }
      if (!twin64 || twin_d.size() != direct.size() || !(twin_d[i] <= 1e-9) || !(direct[i] <= 1e-3))
        fail(why + " (the float64 reference is no reference here)");
      same_function = std::max(same_function, twin_d[i]);
      continue;
    }
    const double bar = std::max(1e-4, std::min(1e-3, 4 * d[i]));
    if (!(e[i] <= bar)) {
      std::ostringstream more;
      more << " (from float64: " << e[i] << ", the input graph's own " << d[i] << ")";
      fail(why + more.str());
    }
    own = std::max(own, d[i]);
    worst_e = std::max(worst_e, e[i]);
  }
  std::ostringstream msg;
  if (own > 0 || worst_e > 0)
    msg << ", or 4x the input graph's own rounding: from float64 " << worst_e << " vs its " << own;
  if (twin64)
    msg << "; where float64 is no reference, both graphs in float64 within " << same_function;
  return msg.str();
}

} // namespace

// A tensor that differs by more than 1e-4 still passes when the input graph
// is that far from exact itself: against the input graph run in float64,
// the rewritten graph's error is at most 4x the input graph's (never over
// 1e-3), and the reference agrees with the input graph within 1e-3 (else it
// drew other random numbers and says nothing). The fuzzer's judge does the
// same against eager (test/fuzz/runner.py): an output-saving inversion's
// rounding, amplified by a cancelling sum, reached 1.03e-4 where the input
// graph itself was off by more (long-fuzz seed 101387).
void verify(const std::shared_ptr<Graph>& before, const std::shared_ptr<Graph>& after,
            const std::vector<c10::IValue>& prefix, const Example& ex,
            const std::vector<at::Tensor>& params, const std::function<void()>& reset,
            const Reference& reference) {
  RunResult r1, r2;
  run_both(before, after, prefix, ex, params, reset, r1, r2);
  if (reset) reset();
  std::vector<std::pair<double, double>> outs, grads;
  direct_distances(r1, r2, outs, grads);
  const auto [worst_out, out_at] = worst_relative(outs);
  const auto [worst_grad, grad_at] = worst_relative(grads);
  std::ostringstream msg;
  msg << "outputs within " << worst_out << ", gradients within " << worst_grad
      << " (relative L2; bar 1e-4";
  if (!(worst_out <= 1e-4) || !(worst_grad <= 1e-4)) {
    const std::string why = "verify failed: " + msg.str() + "); worst: " +
                            (!(worst_out <= 1e-4) ? "output " + std::to_string(out_at)
                                                  : "gradient " + std::to_string(grad_at));
    msg << judge_by_float64(r1, r2, outs, grads, why, reset, reference);
  }
  msg << ")";
  std::cerr << "memslim-opt: verify: ok: " << msg.str() << "\n";
}

} // namespace memslim_opt
