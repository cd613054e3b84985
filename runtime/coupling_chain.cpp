//===- coupling_chain.cpp - additive couplings that keep only their outputs ===//
//
// What: memslim::coupling_chain runs K coupling blocks
//   y1 = x1 (+) F_b(x2);  y2 = x2 (+) G_b(y1);  (x1, x2) = link_b(y1, y2)
// where each half (+) is additive, x + f (RevNet, Reformer, RevViT), or affine,
// x * m + t or (x + t) * m with (m, t) = F(x2) (RealNVP, Glow), with F_b / G_b
// given as TorchScript IR texts (what invertible-couplings cut out of a model),
// and under autograd keeps only the chain's final outputs. Backward walks the
// blocks in reverse: G_b(y1) is re-run with grad, x2 rebuilt from y2 and its
// outputs (y2 - g, (y2 - t) / m, y2 / m - t), then F_b(x2) with grad and x1
// likewise: each F / G runs twice per step, as under torch.utils.checkpoint,
// and the chain keeps 2 tensors instead of every intermediate of every block.
// Hazards the hand-written versions hit (memcnn #12, #39/#70/#73) and how they
// are met here:
// - replays must not touch module state: the inputs a function writes in place
//   (BatchNorm's running stats, found from the graph) are cloned for the
//   re-runs, so running stats move once per step as in eager;
// - random ops replay the forward's numbers: a function with a random op runs
//   in backward from the generator state it started from in forward, and the
//   generator is put back afterwards (the user's stream is not shifted);
// - nothing is freed by hand: inputs are simply not saved, so another reader of
//   a chain input keeps it alive on its own;
// - backward lets go as it walks (the outputs and kept inputs in saved_data,
//   dropped as consumed; F's / G's outputs before their backward; sums in
//   place where nothing else holds the tensor): its peak is one re-run plus the
//   pair, its gradients and the parameter gradients, whatever the chain's length;
// - drift: a block whose input cannot be rebuilt (a shape or dtype change through a
//   half, a link that re-splits; on each call, an affine half whose scale m holds a
//   zero, a NaN or an inf), every `anchor_every`-th block, and each block whose rebuilt
//   input, F / G output there, or F / G gradients there (input and parameters, one
//   fixed cotangent) were off by more than `drift_bound` (relative, max norm; NaN
//   counts as off) on the chain's first differentiated call keeps its exact input (a
//   warning with its bytes). The first call keeps every block's input to measure that.
//   A later batch can still meet an ill-conditioned point the first did not.
// Why a `str[]`: as for recompute_region, text survives printing, saving and
// memslim-opt round trips; each chain is parsed once per process and cached.
//
//===----------------------------------------------------------------------===//
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/library.h>

#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "memslim/plain_cpu.h"
#include "memslim/replay.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

constexpr const char* kOp = "memslim::coupling_chain";

using replay::Fn;
using replay::rng_state;
using replay::RngReplay;
using replay::state_vec;

struct Chain {
  int64_t id = 0;
  std::vector<Fn> fns;          // F_1, G_1, ..., F_K, G_K
  std::vector<int64_t> combine; // per function: 0 x + f, 1 x * m + t, 2 (x + t) * m
  std::mutex mu;                // guards the two fields below
  bool checked = false;
  std::vector<bool> drift_anchor; // blocks whose rebuilt input drifted on the first call
};

std::mutex g_chains_mu;
std::vector<std::shared_ptr<Chain>>& chains() {
  static std::vector<std::shared_ptr<Chain>> all;
  return all;
}

// A function's outputs under combine code `k`: f (additive) or (m, t).
size_t outputs_of(int64_t k) { return k == 0 ? 1 : 2; }

std::shared_ptr<Chain> chain_for(const std::vector<std::string>& texts,
                                 c10::ArrayRef<int64_t> combine) {
  static std::unordered_map<std::string, std::shared_ptr<Chain>> cache;
  TORCH_CHECK(combine.empty() || combine.size() == texts.size(), kOp, ": combine has ",
              combine.size(), " entries for ", texts.size(), " functions");
  for (int64_t k : combine)
    TORCH_CHECK(k >= 0 && k <= 2, kOp, ": unknown combine code ", k,
                " (0: x + f, 1: x * m + t, 2: (x + t) * m)");
  std::string key;
  for (size_t i = 0; i < texts.size(); ++i)
    key += texts[i] + std::string(1, '\0') + (combine.empty() ? "0" : std::to_string(combine[i]));
  std::lock_guard<std::mutex> lock(g_chains_mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  TORCH_CHECK(!texts.empty() && texts.size() % 2 == 0, kOp,
              ": expects an F and a G per block (an even, non-zero number of functions), got ",
              texts.size());
  auto c = std::make_shared<Chain>();
  c->combine.assign(texts.size(), 0);
  for (size_t i = 0; i < combine.size(); ++i) c->combine[i] = combine[i];
  for (size_t i = 0; i < texts.size(); ++i) {
    Fn f =
        replay::parse_fn(texts[i], kOp, "function " + std::to_string(i), outputs_of(c->combine[i]));
    TORCH_CHECK(!f.written[0], kOp, ": function ", i,
                " writes its block input in place (the block would not be invertible)");
    c->fns.push_back(std::move(f));
  }
  c->drift_anchor.assign(texts.size() / 2, false);
  c->id = int64_t(chains().size());
  chains().push_back(c);
  cache.emplace(key, c);
  return c;
}

std::shared_ptr<Chain> chain_by_id(int64_t id) {
  std::lock_guard<std::mutex> lock(g_chains_mu);
  return chains().at(size_t(id));
}

using Outs = std::vector<at::Tensor>; // a function's outputs: f, or (m, t)

Outs run_fn(const Fn& f, const at::Tensor& data, const std::vector<at::Tensor>& ext, bool replay) {
  return replay::run_fn_outputs(f, data, ext, replay, kOp);
}

// A half's output y from its passing input x: the very ops the model ran.
at::Tensor combine(int64_t k, const at::Tensor& x, const Outs& o) {
  if (k == 0) return at::add(x, o[0]);
  if (k == 1) return at::add(at::mul(x, o[0]), o[1]);
  return at::mul(at::add(x, o[1]), o[0]);
}

// x rebuilt from y and the function's outputs: y - f, (y - t) / m, y / m - t,
// rounded once to y's dtype (16-bit blocks rebuild in float32).
at::Tensor rebuild(int64_t k, const at::Tensor& y, const Outs& o) {
  const bool low = y.scalar_type() == at::kHalf || y.scalar_type() == at::kBFloat16;
  auto up = [&](const at::Tensor& t) { return low ? t.to(at::kFloat) : t; };
  at::Tensor x = k == 0   ? at::sub(up(y), up(o[0]))
                 : k == 1 ? at::div(at::sub(up(y), up(o[1])), up(o[0]))
                          : at::sub(at::div(up(y), up(o[0])), up(o[1]));
  return low ? x.to(y.scalar_type()) : x;
}

// Whether an affine half's scale rules out the inverse on this call (a zero loses x; a
// NaN or inf cannot be divided out). Tensors without real data (plain_cpu.h: fake /
// functional / symbolic / meta) are not checked: nothing is inverted there.
bool scale_singular(int64_t k, const Outs& o) {
  if (k == 0) return false;
  const at::Tensor& m = o[0];
  if (!real_data(m) || m.numel() == 0) return false;
  auto [lo, hi] = at::aminmax(m.abs());
  return !(lo.item<double>() > 0) || !(hi.item<double>() < INFINITY);
}

bool same_meta(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

// max|a - b| / max|b|; +inf where that is not a finite number below the bound's scale.
double rel_error(const at::Tensor& a, const at::Tensor& b) {
  if (!same_meta(a, b)) return std::numeric_limits<double>::infinity();
  if (b.numel() == 0) return 0;
  const double err = at::sub(a.to(at::kDouble), b.to(at::kDouble)).abs().max().item<double>();
  const double scale = b.to(at::kDouble).abs().max().item<double>();
  const double r = err / std::max(scale, 1e-30);
  return std::isfinite(r) ? r : std::numeric_limits<double>::infinity();
}

struct Layout {
  size_t blocks;
  std::vector<size_t> offset; // where function i's external inputs start in `state`
  std::vector<int64_t> arity;
  // (kind, cat dim, chunk dim) per link: 0 direct, 1 chunk(cat([y1, y2], d1), 2, d2)
  std::vector<int64_t> links;
};

Layout layout(size_t nfns, c10::ArrayRef<int64_t> arity, c10::ArrayRef<int64_t> links,
              size_t nstate) {
  TORCH_CHECK(arity.size() == nfns, kOp, ": arity has ", arity.size(), " entries for ", nfns,
              " functions");
  Layout l{nfns / 2, {}, arity.vec(), links.vec()};
  TORCH_CHECK(links.size() == 3 * (l.blocks - 1), kOp, ": links has ", links.size(),
              " entries, expected 3 per link between ", l.blocks, " blocks");
  for (size_t i = 0; i < links.size(); i += 3)
    TORCH_CHECK(links[i] == 0 || links[i] == 1, kOp, ": unknown link kind ", links[i]);
  size_t at = 0;
  for (int64_t a : arity) {
    TORCH_CHECK(a >= 0, kOp, ": negative arity");
    l.offset.push_back(at);
    at += size_t(a);
  }
  TORCH_CHECK(at == nstate, kOp, ": the functions take ", at, " external inputs, state has ",
              nstate);
  return l;
}

std::vector<at::Tensor> slice(at::TensorList state, const Layout& l, size_t fn) {
  return std::vector<at::Tensor>(state.begin() + l.offset[fn],
                                 state.begin() + l.offset[fn] + l.arity[fn]);
}

// link_b(y1, y2): the next block's inputs, and whether that split differs from (y1, y2)
// (then the block's outputs cannot be read back from them).
std::pair<at::Tensor, at::Tensor> link(const Layout& l, size_t b, const at::Tensor& y1,
                                       const at::Tensor& y2, bool& resplit) {
  resplit = false;
  if (l.links[3 * b] == 0) return {y1, y2};
  auto parts = at::chunk(at::cat({y1, y2}, l.links[3 * b + 1]), 2, l.links[3 * b + 2]);
  TORCH_CHECK(parts.size() == 2, kOp, ": a link's chunk gave ", parts.size(), " pieces");
  resplit = !same_meta(parts[0], y1) || !same_meta(parts[1], y2);
  // The pieces either way: equal values, and the memory layout the original program's
  // next block reads (a random op fills its mask in memory order: fuzz seed 800836).
  return {parts[0], parts[1]};
}

// Forward of the whole chain (no autograd graph). `keep_in` / `keep_out` get the blocks'
// exact inputs / outputs where asked (or needed).
struct ForwardRecord {
  std::vector<at::Tensor> in1, in2, out1, out2; // per block; undefined: not kept
  std::vector<bool> no_inverse;                 // the add changed shape / dtype
  std::vector<at::Tensor> rng;                  // per function; undefined: not random
  // Per random function: the strides its data input had (replays feed it the
  // same layout: a mask is drawn in memory order); empty for the others.
  std::vector<std::vector<int64_t>> strides;
};

// `t` with `strides` (a copy where its own differ; `strides` empty: as it is).
at::Tensor with_strides(const at::Tensor& t, const std::vector<int64_t>& strides) {
  if (strides.empty() || t.strides().vec() == strides) return t;
  at::Tensor o = at::empty_strided(t.sizes(), strides, t.options());
  o.copy_(t);
  return o;
}

std::pair<at::Tensor, at::Tensor> run_chain(Chain& c, const Layout& l, at::Tensor x1, at::Tensor x2,
                                            at::TensorList state, const std::vector<bool>& keep,
                                            ForwardRecord* rec) {
  if (rec) {
    rec->in1.assign(l.blocks, {});
    rec->in2.assign(l.blocks, {});
    rec->out1.assign(l.blocks, {});
    rec->out2.assign(l.blocks, {});
    rec->no_inverse.assign(l.blocks, false);
    rec->rng.assign(2 * l.blocks, {});
    rec->strides.assign(2 * l.blocks, {});
  }
  for (size_t b = 0; b < l.blocks; ++b) {
    const Fn& F = c.fns[2 * b];
    const Fn& G = c.fns[2 * b + 1];
    if (rec) rec->rng[2 * b] = rng_state(F, x2.device());
    if (rec && F.random) rec->strides[2 * b] = x2.strides().vec();
    const int64_t kf = c.combine[2 * b], kg = c.combine[2 * b + 1];
    const Outs f = run_fn(F, x2, slice(state, l, 2 * b), false);
    at::Tensor y1 = combine(kf, x1, f);
    if (rec) rec->rng[2 * b + 1] = rng_state(G, y1.device());
    if (rec && G.random) rec->strides[2 * b + 1] = y1.strides().vec();
    const Outs g = run_fn(G, y1, slice(state, l, 2 * b + 1), false);
    at::Tensor y2 = combine(kg, x2, g);
    if (rec) {
      rec->no_inverse[b] = !same_meta(y1, x1) || !same_meta(y2, x2) || scale_singular(kf, f) ||
                           scale_singular(kg, g);
      if (keep[b] || rec->no_inverse[b]) {
        rec->in1[b] = x1;
        rec->in2[b] = x2;
      }
    }
    if (b + 1 == l.blocks) return {y1, y2};
    bool resplit = false;
    std::tie(x1, x2) = link(l, b, y1, y2, resplit);
    if (rec && resplit) {
      rec->out1[b] = y1;
      rec->out2[b] = y2;
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

// What first_call_check compares at a block: F's / G's outputs and gradients at
// a rebuilt input against those at the exact one.
struct DriftProbe {
  Chain& c;
  const Layout& l;
  at::TensorList state;
  const ForwardRecord& rec;
  double bound;

  // Function fn re-run on `in` from the forward's generator state.
  Outs run(size_t fn, const at::Tensor& in) const {
    RngReplay replay(rec.rng[fn], in.device());
    return run_fn(c.fns[fn], with_strides(in, rec.strides[fn]), slice(state, l, fn), true);
  }

  static double outs_error(const Outs& a, const Outs& b) {
    double e = 0;
    for (size_t k = 0; k < a.size(); ++k) e = std::max(e, rel_error(a[k], b[k]));
    return e;
  }

  // The gradients of function fn at `in` (its input's and its floating-point state's:
  // parameters) for one fixed cotangent: what backward computes there. Values can agree
  // to the bound while derivatives do not: a rebuilt all-zero row under LayerNorm becomes
  // noise times 1/sqrt(eps) and flips the ReLU6 after it (fuzz seed 900440: an input
  // gradient off by 112 where eager's is 1).
  std::vector<at::Tensor> vjp(size_t fn, const at::Tensor& in) const {
    at::AutoGradMode grad_mode(true);
    std::vector<at::Tensor> ext = slice(state, l, fn), wrt;
    wrt.push_back(in.detach().requires_grad_(true));
    for (size_t k = 0; k < ext.size(); ++k) // not what it writes: running stats
      if (ext[k].defined() && ext[k].is_floating_point() && !c.fns[fn].written[k + 1]) {
        ext[k] = ext[k].detach().requires_grad_(true);
        wrt.push_back(ext[k]);
      }
    RngReplay replay(rec.rng[fn], in.device());
    const Outs outs = run_fn(c.fns[fn], with_strides(wrt[0], rec.strides[fn]), ext, true);
    // One fixed cotangent per output (the same draws at every point).
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(900440);
    std::vector<at::Tensor> diff, cots;
    for (const at::Tensor& out : outs) {
      const at::Tensor cot = at::randn(out.sizes(), gen, at::TensorOptions().dtype(at::kFloat))
                                 .to(out.device(), out.scalar_type());
      if (!out.requires_grad()) continue;
      diff.push_back(out);
      cots.push_back(cot);
    }
    if (diff.empty()) return std::vector<at::Tensor>{};
    return torch::autograd::grad(diff, wrt, cots, false, false, true);
  }

  // How far the gradients at the rebuilt input are from those at the exact one, counted
  // only beyond 10x what relative noise of the rebuild's own size does to them at the
  // exact input: fp32 RevNet's gradients move by 1e-2 under that noise (eager fp32 is off
  // float64 as much), seed 900440's do not (a zero row stays zero under relative noise,
  // not under the rebuild's absolute error).
  double vjp_error(size_t fn, const at::Tensor& in, const at::Tensor& exact_in) const {
    const std::vector<at::Tensor> a = vjp(fn, in), b = vjp(fn, exact_in);
    if (a.size() != b.size()) return double(INFINITY);
    auto worst_of = [&](const std::vector<at::Tensor>& x) {
      double e = 0;
      for (size_t k = 0; k < x.size(); ++k)
        if (x[k].defined() != b[k].defined())
          e = INFINITY;
        else if (x[k].defined())
          e = std::max(e, rel_error(x[k], b[k]));
      return e;
    };
    const double err = worst_of(a);
    if (!(err > bound)) return err;
    const double rho = std::max(rel_error(in, exact_in), 1e-7);
    if (!std::isfinite(rho)) return err;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(912100);
    const at::Tensor u = at::rand(exact_in.sizes(), gen, at::TensorOptions().dtype(at::kDouble))
                             .mul_(2 * rho)
                             .sub_(rho)
                             .add_(1)
                             .to(exact_in.device());
    const at::Tensor noisy = exact_in.to(at::kDouble).mul(u).to(exact_in.scalar_type());
    const std::vector<at::Tensor> n = vjp(fn, noisy);
    if (n.size() != b.size()) return err;
    const double noise = worst_of(n);
    return std::isfinite(noise) && err <= 10 * noise ? 0.0 : err;
  }
};

// The per-function strides ForwardRecord kept, from their flat form in saved_data.
std::vector<std::vector<int64_t>> saved_strides(AutogradContext* ctx) {
  std::vector<std::vector<int64_t>> strides;
  const auto flat = ctx->saved_data["strides"].toIntVector();
  size_t at = 0;
  for (int64_t n : ctx->saved_data["strides_len"].toIntVector()) {
    strides.emplace_back(flat.begin() + long(at), flat.begin() + long(at) + n);
    at += size_t(n);
  }
  return strides;
}

// The exact inputs / outputs the forward kept per block (undefined: not kept).
struct KeptBlocks {
  std::vector<at::Tensor> in1, in2, out1, out2;
};

// Moved out of `acts`: the chain's outputs, then per block its inputs (in_at), outputs (out_at).
KeptBlocks kept_blocks(std::vector<at::Tensor>& acts, const std::vector<int64_t>& in_at,
                       const std::vector<int64_t>& out_at, size_t blocks) {
  KeptBlocks k{std::vector<at::Tensor>(blocks), std::vector<at::Tensor>(blocks),
               std::vector<at::Tensor>(blocks), std::vector<at::Tensor>(blocks)};
  size_t at = 2;
  size_t i = 0, o = 0;
  for (size_t b = 0; b < blocks; ++b) {
    if (i < in_at.size() && size_t(in_at[i]) == b) {
      k.in1[b] = std::move(acts[at++]);
      k.in2[b] = std::move(acts[at++]);
      ++i;
    }
    if (o < out_at.size() && size_t(out_at[o]) == b) {
      k.out1[b] = std::move(acts[at++]);
      k.out2[b] = std::move(acts[at++]);
      ++o;
    }
  }
  return k;
}

// One backward call's working set: the state the functions read (`slot`: each entry's
// autograd input index, 0 for none), the forward's generator states and strides, and
// the gradients gathered into `result`.
struct ChainBackward {
  AutogradContext* ctx;
  Chain& c;
  const Layout& l;
  const std::vector<at::Tensor>& state;
  const std::vector<at::Tensor>& rng;
  const std::vector<std::vector<int64_t>>& strides;
  const std::vector<size_t>& slot;
  variable_list& result;
  std::vector<at::Tensor> ext;

  // Gradients of the state (parameters), summed over the functions reading them.
  void add_grad(size_t index, const at::Tensor& g) {
    if (!g.defined() || !slot[index]) return;
    replay::accumulate(result[slot[index]], g);
  }

  // The state a function reads: leaves for the entries that need a gradient.
  void leaves(size_t fn, std::vector<at::Tensor>& wrt, std::vector<size_t>& wrt_index) {
    ext.clear();
    for (int64_t k = 0; k < l.arity[fn]; ++k) {
      const size_t index = l.offset[fn] + size_t(k);
      const at::Tensor& t = state[index];
      if (t.defined() && slot[index] && ctx->needs_input_grad(slot[index])) {
        ext.push_back(t.detach().requires_grad_(true));
        wrt.push_back(ext.back());
        wrt_index.push_back(index);
      } else {
        ext.push_back(t.defined() ? t.detach() : t);
      }
    }
  }

  // One half, y = x (+) fn(in): fn re-run on `in` with grad, x rebuilt from y (or the
  // kept exact one), `g_in` (in's) and the state's gradients gain fn's vector-Jacobian
  // product, `gy` becomes x's. y goes once x is rebuilt, fn's outputs before their
  // backward runs (their graph edges stand for them).
  at::Tensor half(size_t fn, const at::Tensor& in_value, at::Tensor& y, at::Tensor exact_x,
                  at::Tensor& gy, at::Tensor& g_in) {
    const int64_t k = c.combine[fn];
    std::vector<at::Tensor> wrt;
    std::vector<size_t> wrt_index;
    at::Tensor in = in_value.detach().requires_grad_(true);
    wrt.push_back(in);
    leaves(fn, wrt, wrt_index);
    Outs o;
    {
      at::AutoGradMode grad_mode(true);
      RngReplay replay(rng[fn], in.device());
      o = run_fn(c.fns[fn], with_strides(in, strides[fn]), ext, true);
    }
    Outs od;
    for (const at::Tensor& t : o) od.push_back(t.detach());
    const at::Tensor x = exact_x.defined() ? std::move(exact_x) : rebuild(k, y, od);
    y.reset();
    // dL/d outputs: f: gy; m, t of x * m + t: gy x, gy; of (x + t) * m:
    // gy (x + t), gy m (each summed to its output's shape where it broadcast).
    Outs cot;
    at::Tensor gx = gy;
    if (k == 0) {
      cot = {gy};
    } else if (k == 1) {
      cot = {at::mul(gy, x), gy};
      gx = at::mul(gy, od[0]);
    } else {
      gx = at::mul(gy, od[0]);
      cot = {at::mul(gy, at::add(x, od[1])), gx};
    }
    torch::autograd::edge_list roots;
    variable_list diff_cot;
    for (size_t j = 0; j < o.size(); ++j) {
      if (!o[j].requires_grad()) continue;
      roots.push_back(torch::autograd::impl::gradient_edge(o[j]));
      at::Tensor ct = cot[j];
      if (ct.sizes() != o[j].sizes()) ct = at::sum_to(ct, o[j].sizes());
      diff_cot.push_back(ct.to(o[j].scalar_type()));
    }
    o = od = cot = Outs();
    if (gx.sizes() != x.sizes()) gx = at::sum_to(gx, x.sizes());
    gy = std::move(gx);
    if (!roots.empty()) {
      auto d = replay::grad_from_edges(roots, diff_cot, wrt);
      diff_cot.clear();
      if (d[0].defined()) replay::accumulate(g_in, d[0]);
      for (size_t j = 0; j < wrt_index.size(); ++j) add_grad(wrt_index[j], d[j + 1]);
    }
    return x;
  }
};

struct CouplingChainFunction : public torch::autograd::Function<CouplingChainFunction> {
  // `present`: the defined entries of the state (autograd takes no undefined
  // inputs), `where` their indices among its `size` entries (None elsewhere).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x1, const at::Tensor& x2,
                               at::TensorList present, const std::vector<std::string>& fns,
                               const std::vector<int64_t>& arity, const std::vector<int64_t>& links,
                               int64_t anchor_every, double drift_bound,
                               const std::vector<int64_t>& combine,
                               const std::vector<int64_t>& where, int64_t size) {
    const std::vector<at::Tensor> state_v = replay::join_present(present, where, size);
    const at::TensorList state(state_v);
    ctx->saved_data["where"] = where;
    std::shared_ptr<Chain> c = chain_for(fns, combine);
    const Layout l = layout(fns.size(), arity, links, state.size());
    bool check;
    std::vector<bool> keep(l.blocks, false);
    {
      std::lock_guard<std::mutex> lock(c->mu);
      // The first call with real data (a traced call's fake tensors cannot be read).
      check = !c->checked && real_data(x1) && real_data(x2);
      for (size_t b = 0; b < l.blocks; ++b)
        keep[b] =
            check || c->drift_anchor[b] || (anchor_every > 0 && b > 0 && b % anchor_every == 0);
    }
    ForwardRecord rec;
    at::Tensor y1, y2;
    {
      at::NoGradGuard no_grad;
      std::tie(y1, y2) = run_chain(*c, l, x1, x2, state, keep, &rec);
      if (check) first_call_check(*c, l, state, y1, y2, rec, drift_bound, anchor_every, keep);
    }
    // What backward reads: the outputs, then the exact inputs / outputs of the
    // blocks that keep them (their indices in saved_data).
    std::vector<at::Tensor> saved{y1, y2};
    std::vector<int64_t> in_at, out_at;
    for (size_t b = 0; b < l.blocks; ++b) {
      if (rec.in1[b].defined() && (keep[b] || rec.no_inverse[b])) {
        in_at.push_back(int64_t(b));
        saved.push_back(rec.in1[b]);
        saved.push_back(rec.in2[b]);
      }
      if (rec.out1[b].defined()) {
        out_at.push_back(int64_t(b));
        saved.push_back(rec.out1[b]);
        saved.push_back(rec.out2[b]);
      }
    }
    ctx->saved_data["chain"] = c->id;
    ctx->saved_data["arity"] = arity;
    ctx->saved_data["links"] = links;
    ctx->saved_data["in_at"] = in_at;
    ctx->saved_data["out_at"] = out_at;
    ctx->saved_data["rng"] = rec.rng;
    {
      std::vector<int64_t> flat, len;
      for (const auto& st : rec.strides) {
        len.push_back(int64_t(st.size()));
        flat.insert(flat.end(), st.begin(), st.end());
      }
      ctx->saved_data["strides"] = flat;
      ctx->saved_data["strides_len"] = len;
    }
    // The state the functions read: saved as eager's ops save it (parameters,
    // a mask), but for what they write (BatchNorm's running stats, which the
    // next forward updates in place, and replays copy anyway): no version check.
    std::vector<bool> written(state.size(), false);
    for (size_t fn = 0; fn < c->fns.size(); ++fn)
      for (int64_t k = 0; k < l.arity[fn]; ++k)
        if (c->fns[fn].written[size_t(k) + 1]) written[l.offset[fn] + size_t(k)] = true;
    std::vector<at::Tensor> unversioned(state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      if (written[i] && state[i].defined())
        unversioned[i] = state[i];
      else
        saved.push_back(state[i]);
    }
    ctx->saved_data["unversioned"] = unversioned;
    // The activations (`acts` first entries of `saved`) go to saved_data, so
    // backward can let each go: detached aliases (an output with its grad_fn
    // would be a cycle) and their versions, checked as autograd checks. Under
    // saved-tensor hooks (offloading, memslim.saved_bytes) they stay saved tensors.
    const size_t acts = 2 + 2 * (in_at.size() + out_at.size());
    if (!at::SavedTensorDefaultHooks::get_hooks().has_value()) {
      std::vector<at::Tensor> alias;
      std::vector<int64_t> version;
      for (size_t i = 0; i < acts; ++i) {
        alias.push_back(saved[i].detach());
        version.push_back(int64_t(saved[i]._version()));
      }
      ctx->saved_data["acts"] = alias;
      ctx->saved_data["acts_version"] = version;
      saved.erase(saved.begin(), saved.begin() + long(acts));
    }
    ctx->save_for_backward(saved);
    return {y1, y2};
  }

  // A block's two inputs as autograd counts them: each storage once (chains.py reads it).
  static int64_t input_bytes(const at::Tensor& a, const at::Tensor& b) {
    const bool one = a.defined() && b.defined() && a.storage().is_alias_of(b.storage());
    return (a.defined() ? int64_t(a.storage().nbytes()) : 0) +
           (b.defined() && !one ? int64_t(b.storage().nbytes()) : 0);
  }

  // The chain's first differentiated call: rebuild every block's input as backward will,
  // and mark the blocks off by more than the bound (they keep their exact input from now
  // on): the rebuilt input against the kept one, and F's / G's output (and gradients)
  // there against those at the exact one, since backward differentiates them there (a
  // BatchNorm in G turns 1e-6 of a large-mean input into 1e-3: fuzz seed 701039).
  static void first_call_check(Chain& c, const Layout& l, at::TensorList state, at::Tensor r1,
                               at::Tensor r2, const ForwardRecord& rec, double bound,
                               int64_t anchor_every, std::vector<bool>& keep) {
    std::vector<bool> drift(l.blocks, false);
    std::vector<double> worst(l.blocks, 0);
    const DriftProbe probe{c, l, state, rec, bound};
    auto off = [&](size_t b, double err) {
      worst[b] =
          std::max(worst[b], std::isnan(err) ? std::numeric_limits<double>::infinity() : err);
      if (!(err <= bound)) drift[b] = true;
    };
    bool exact = true; // r1, r2 are the exact outputs of block i
    for (size_t i = l.blocks; i-- > 0;) {
      if (rec.out1[i].defined()) {
        r1 = rec.out1[i];
        r2 = rec.out2[i];
        exact = true;
      }
      if (rec.no_inverse[i]) {
        r1 = rec.in1[i];
        r2 = rec.in2[i];
        exact = true;
        continue;
      }
      Outs g = probe.run(2 * i + 1, r1);
      if (!exact) {
        // r1 came from block i + 1's rebuilt input: judge it by G's output.
        const at::Tensor y1 = rec.out1[i].defined() ? rec.out1[i] : rec.in1[i + 1];
        const at::Tensor y2 = rec.out2[i].defined() ? rec.out2[i] : rec.in2[i + 1];
        const Outs g_exact = probe.run(2 * i + 1, y1);
        off(i + 1,
            std::max(DriftProbe::outs_error(g, g_exact), probe.vjp_error(2 * i + 1, r1, y1)));
        if (drift[i + 1]) { // block i + 1 keeps its input: block i starts exact
          r1 = y1;
          r2 = y2;
          g = g_exact;
        }
      }
      const at::Tensor x2 = rebuild(c.combine[2 * i + 1], r2, g);
      const Outs f = probe.run(2 * i, x2);
      const at::Tensor x1 = rebuild(c.combine[2 * i], r1, f);
      off(i, std::max(rel_error(x1, rec.in1[i]), rel_error(x2, rec.in2[i])));
      off(i, DriftProbe::outs_error(f, probe.run(2 * i, rec.in2[i])));
      off(i, probe.vjp_error(2 * i, x2, rec.in2[i]));
      const bool anchored = anchor_every > 0 && i > 0 && i % size_t(anchor_every) == 0;
      exact = drift[i] || anchored;
      r1 = exact ? rec.in1[i] : x1;
      r2 = exact ? rec.in2[i] : x2;
    }
    for (size_t b = 0; b < l.blocks; ++b)
      if (drift[b])
        TORCH_WARN(kOp, ": block ", b, " of a coupling chain is rebuilt with relative error ",
                   worst[b], " > ", bound, "; it keeps its exact input (",
                   input_bytes(rec.in1[b], rec.in2[b]), " B) from now on");
    std::lock_guard<std::mutex> lock(c.mu);
    for (size_t b = 0; b < l.blocks; ++b) {
      c.drift_anchor[b] = c.drift_anchor[b] || drift[b];
      keep[b] = c.drift_anchor[b] || (anchor_every > 0 && b > 0 && b % size_t(anchor_every) == 0);
    }
    c.checked = true;
  }

  // `grads` by reference (CppNode passes its own list): moved out, each goes once replaced.
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(), kOp,
                ": double backward is not supported (the blocks are differentiated on rebuilt, "
                "detached inputs); keep such code out of the optimized model");
    std::shared_ptr<Chain> c = chain_by_id(ctx->saved_data["chain"].toInt());
    const auto arity = ctx->saved_data["arity"].toIntVector();
    const auto links = ctx->saved_data["links"].toIntVector();
    const auto in_at = ctx->saved_data["in_at"].toIntVector();
    const auto out_at = ctx->saved_data["out_at"].toIntVector();
    const std::vector<at::Tensor> rng = ctx->saved_data["rng"].toTensorVector();
    const std::vector<std::vector<int64_t>> strides = saved_strides(ctx);
    std::vector<at::Tensor> state = ctx->saved_data["unversioned"].toTensorVector();
    const Layout l = layout(c->fns.size(), arity, links, state.size());
    variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> acts = take_acts(ctx, saved, in_at.size() + out_at.size());
    {
      size_t next = saved.size();
      for (size_t i = state.size(); i-- > 0;)
        if (!state[i].defined()) state[i] = saved[--next]; // saved last, in order
    }
    const auto where = ctx->saved_data["where"].toIntVector();
    std::vector<size_t> slot(state.size(), 0); // state index -> autograd input index
    for (size_t i = 0; i < where.size(); ++i) slot[size_t(where[i])] = 2 + i;
    // + fns, arity, links, anchor_every, bound, combine, where, size
    variable_list result(2 + where.size() + 8);
    ChainBackward step{ctx, *c, l, state, rng, strides, slot, result, {}};
    at::Tensor g1 = std::move(grads[0]), g2 = std::move(grads[1]); // zeros for None: materialized
    at::Tensor r1 = std::move(acts[0]), r2 = std::move(acts[1]);
    KeptBlocks ex = kept_blocks(acts, in_at, out_at, l.blocks);
    for (size_t b = l.blocks; b-- > 0;) {
      if (ex.out1[b].defined()) {
        r1 = std::move(ex.out1[b]);
        r2 = std::move(ex.out2[b]);
      }
      // G: y1 -> g; x2 rebuilt from y2. Then F: x2 -> f; x1 rebuilt from y1.
      r2 = step.half(2 * b + 1, r1, r2, std::move(ex.in2[b]), g2, g1);
      r1 = step.half(2 * b, r2, r1, std::move(ex.in1[b]), g1, g2);
      // Back across the link to the previous block's outputs: direct, or
      // cat then chunk into the same pieces, the identity for the gradient too;
      // a link that re-split kept that block's outputs (ex.out): the gradient
      // goes back through cat / chunk there.
      if (b > 0 && ex.out1[b - 1].defined()) {
        const int64_t cat_dim = l.links[3 * (b - 1) + 1], chunk_dim = l.links[3 * (b - 1) + 2];
        const at::Tensor whole = at::cat({std::exchange(g1, {}), std::exchange(g2, {})}, chunk_dim);
        auto parts = whole.split_with_sizes(
            {ex.out1[b - 1].size(cat_dim), ex.out2[b - 1].size(cat_dim)}, cat_dim);
        g1 = parts[0].contiguous();
        g2 = parts[1].contiguous();
      }
    }
    result[0] = ctx->needs_input_grad(0) ? g1 : at::Tensor();
    result[1] = ctx->needs_input_grad(1) ? g2 : at::Tensor();
    return result;
  }

  // The activations forward kept, taken out of saved_data (dropped there unless
  // retain_graph: the walk holds the only references) or of `saved` (hooks).
  static std::vector<at::Tensor> take_acts(AutogradContext* ctx, variable_list& saved,
                                           size_t kept) {
    const size_t n = 2 + 2 * kept;
    std::vector<at::Tensor> acts;
    if (ctx->saved_data.find("acts") == ctx->saved_data.end()) { // saved under hooks
      acts.assign(std::make_move_iterator(saved.begin()),
                  std::make_move_iterator(saved.begin() + long(n)));
      saved.erase(saved.begin(), saved.begin() + long(n));
      return acts;
    }
    acts = ctx->saved_data["acts"].toTensorVector();
    const auto version = ctx->saved_data["acts_version"].toIntVector();
    TORCH_INTERNAL_ASSERT(acts.size() == n && version.size() == n);
    for (size_t i = 0; i < n; ++i)
      TORCH_CHECK(int64_t(acts[i]._version()) == version[i], kOp,
                  ": an output or kept input its backward needs was modified by an inplace "
                  "operation: it is at version ",
                  acts[i]._version(), "; expected version ", version[i], " instead");
    if (!torch::autograd::get_current_graph_task_keep_graph())
      for (const char* key : {"acts", "acts_version"}) ctx->saved_data.erase(key);
    return acts;
  }
};

std::tuple<at::Tensor, at::Tensor> coupling_chain_plain(
    const at::Tensor& x1, const at::Tensor& x2, const c10::List<std::optional<at::Tensor>>& state,
    c10::ArrayRef<std::string> fns, c10::IntArrayRef arity, c10::IntArrayRef links,
    int64_t anchor_every, double drift_bound, c10::IntArrayRef combine) {
  std::shared_ptr<Chain> c = chain_for(fns.vec(), combine);
  const std::vector<at::Tensor> s = state_vec(state);
  const Layout l = layout(fns.size(), arity, links, s.size());
  auto [y1, y2] = run_chain(*c, l, x1, x2, s, std::vector<bool>(l.blocks, false), nullptr);
  return {y1, y2};
}

std::tuple<at::Tensor, at::Tensor> coupling_chain_autograd(
    const at::Tensor& x1, const at::Tensor& x2, const c10::List<std::optional<at::Tensor>>& state,
    c10::ArrayRef<std::string> fns, c10::IntArrayRef arity, c10::IntArrayRef links,
    int64_t anchor_every, double drift_bound, c10::IntArrayRef combine) {
  const std::vector<at::Tensor> s = state_vec(state);
  if (replay::needs_autograd({x1, x2}, s)) {
    const replay::PresentState p = replay::split_present(s);
    auto out = CouplingChainFunction::apply(x1, x2, at::TensorList(p.present), fns.vec(),
                                            arity.vec(), links.vec(), anchor_every, drift_bound,
                                            combine.vec(), p.where, p.size);
    return {out[0], out[1]};
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return coupling_chain_plain(x1, x2, state, fns, arity, links, anchor_every, drift_bound, combine);
}

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) {
  m.impl("coupling_chain", TORCH_FN(coupling_chain_autograd));
}

// Every backend: the functions' own aten ops do the work.
TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("coupling_chain", TORCH_FN(coupling_chain_plain));
}

} // namespace memslim
