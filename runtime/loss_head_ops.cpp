//===- loss_head_ops.cpp - cross_entropy(linear(h, W)) without the logits -===//
//
// What: memslim::linear_cross_entropy(input, weight, bias, target, reduction,
// ignore_index, label_smoothing, logits_dtype, chunk): aten's
// cross_entropy(linear(input, weight, bias)[.to(logits_dtype)], target, ...)
// for class-index targets, computed `chunk` rows of tokens at a time, so that
// neither the logits nor softmax's output ever exist whole: the step's peak
// holds one chunk of them. Two ways to backward:
// - gradients in forward (a scalar loss, grads_in_forward, the default): each
//   chunk's logits also give their gradient for a loss gradient of one, and
//   linear's backward runs on it at once (as Liger's fused linear cross
//   entropy): three matmuls of the head, as aten's; keeps the input's and
//   weight's gradients, which backward scales (or hands over as they are for a
//   gradient of exactly one);
// - recomputing (reduction none, or grads_in_forward=False): keeps the input,
//   the targets and one log-sum-exp per row (opmath); backward recomputes each
//   chunk's logits (a fourth matmul) and runs linear's backward on the chunk.
// The weight's gradient accumulates in place (in fp32 for 16-bit weights).
// `logits` given (a head whose logits the graph also returns): they are
// linear(input, weight, bias) as the graph computed them (memslim::linear,
// linear_ops.cpp); the forward copies each chunk of them in place of its
// matmul and gives them no gradient (the loss's reaches the input, weight and
// bias directly; the linear's backward sees only the other readers').
// Values: the loss is aten's to rounding (the log-sum-exp in opmath; label
// smoothing as aten's: both terms' mean divides by the rows not ignored); the gradients
// are aten's to the rounding of chunked accumulation. Targets outside
// [0, vocab) other than ignore_index are an error on the CPU, as in aten.
// The forwards and the backward are internal ops (linear_cross_entropy_forward
// / _fused / _backward: CompositeExplicitAutograd kernels over aten ops, so
// every device runs them, and Meta kernels), so torch.compile's partitioner
// sees opaque calls and cannot save the logits between them.
// Why: in language models the head's logits (tokens x vocabulary, plus
// log_softmax's output) are the largest activation of the step.
// Double backward is not supported (a create_graph backward raises).
//
//===----------------------------------------------------------------------===//
#include <ATen/Functions.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>

#include "memslim/kernels/launch.h"
#include "memslim/plain_cpu.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kNone = 0, kMean = 1, kSum = 2; // at::Reduction

// One call's non-tensor arguments.
struct LceCall {
  int64_t reduction = kMean;
  int64_t ignore_index = -100;
  double smoothing = 0.0;
  std::optional<at::ScalarType> logits_dtype;
  int64_t chunk = 0;
  at::Tensor logits; // given: linear(input, weight, bias) as the graph made it
};

// The rows of one chunk: `chunk` when given, else from the cost of chunking.
// The op holds the weight's gradient (vocab x d, fp32 accumulation) whatever
// the chunk; a chunk adds rows x vocab logits (`logit_bytes` each) to it. The
// work chunking adds is per chunk and the size of the weight (each chunk's
// matmuls stream W twice and the weight's gradient in and out once: 16 vocab
// d B), so it falls as 1 / rows while the chunk's bytes grow with rows, both in
// proportion to vocab. The rule: a chunk's logits are 30% of the weight
// gradient's bytes, rows = 0.3 * d * 4 / logit_bytes (a multiple of 16): the
// step's peak is the weight's gradient plus 30%, vocab 32,000 or 128,256 alike
// (d 512 fp32: 144 rows, 128 once equal, 0.43x Inductor's peak at 1,024
// tokens; bench/results/loss_head_alone_2026-12-01_faa620d.md). The added
// traffic is then 16 B per 0.375 * rows flops of the head (54 flop/B at 144
// rows), above a CPU's balance, so in principle hidden; measured, MKL's
// matmuls of so few rows run slower (bench/results/loss_head_2026-11-29b.md),
// hence a floor of 128 rows (vocab 128,256 at 32 rows ran 1.98x Inductor's
// step; GPT-2's d 256 would give 64 rows: 16 chunks of 1,024 tokens).
// The chunks are then made equal (at most that many rows each): 1,024 rows at
// 144 left a last chunk of 16 whose three matmuls took 27 ms of a 0.72 s step.
int64_t rows_per_chunk(int64_t rows, int64_t d, int64_t logit_bytes, int64_t chunk) {
  const int64_t n = std::max<int64_t>(rows, 1);
  const int64_t by_cost = (3 * d * 4 / (10 * std::max<int64_t>(logit_bytes, 1))) / 16 * 16;
  const int64_t most = std::min(chunk > 0 ? chunk : std::max<int64_t>(by_cost, 128), n);
  const int64_t chunks = (n + most - 1) / most;
  return (n + chunks - 1) / chunks;
}

at::ScalarType logits_type(const at::Tensor& input, const LceCall& c) {
  return c.logits_dtype.value_or(input.scalar_type());
}

// Vocabulary entries per matmul of a chunk's logits on the CPU: MKL's
// [144, 512] x [512, 32,000] took 36.7 ms whole and 30.4 ms as 16 matmuls of
// 2,000 columns, each into its columns of the chunk (the same values, bit for
// bit: no sum is split). Measured 2026-12-01, 2 threads (docs/facts.md).
constexpr int64_t kVocabTile = 2000;

// One chunk's logits as the model computes them: linear in the input's dtype
// (the model's cast, if any, applied by the caller); fp32 on the CPU in tiles
// of the vocabulary.
at::Tensor chunk_linear(const at::Tensor& hc, const at::Tensor& w, const at::Tensor& b) {
  const int64_t V = w.size(0);
  if (!(plain_cpu(hc) && plain_cpu(w) && hc.scalar_type() == at::kFloat &&
        w.scalar_type() == at::kFloat && (!b.defined() || b.scalar_type() == at::kFloat) &&
        V > kVocabTile))
    return at::linear(hc, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
  at::Tensor z = at::empty({hc.size(0), V}, hc.options());
  for (int64_t v = 0; v < V; v += kVocabTile) {
    const int64_t n = std::min(kVocabTile, V - v);
    at::Tensor zv = z.narrow(1, v, n);
    if (b.defined())
      at::addmm_out(zv, b.narrow(0, v, n), hc, w.narrow(0, v, n).t());
    else
      at::mm_out(zv, hc, w.narrow(0, v, n).t());
  }
  return z;
}

void check_args(const at::Tensor& input, const at::Tensor& w, const at::Tensor& target,
                const LceCall& c) {
  TORCH_CHECK(input.dim() >= 1 && w.dim() == 2 && input.sym_size(-1) == w.sym_size(1),
              "memslim::linear_cross_entropy: input [..., d] and weight [vocab, d] expected");
  TORCH_CHECK(!at::isFloatingType(target.scalar_type()) && !at::isComplexType(target.scalar_type()),
              "memslim::linear_cross_entropy: targets must be class indices");
  TORCH_CHECK(target.sym_numel() * input.sym_size(-1) == input.sym_numel(),
              "memslim::linear_cross_entropy: one target per row of the input expected");
  TORCH_CHECK(c.reduction == kNone || c.reduction == kMean || c.reduction == kSum,
              "memslim::linear_cross_entropy: reduction must be 0 (none), 1 (mean) or 2 (sum)");
  TORCH_CHECK(c.smoothing >= 0.0 && c.smoothing <= 1.0,
              "memslim::linear_cross_entropy: label_smoothing must be in [0, 1]");
  TORCH_CHECK(
      !c.logits.defined() || (c.logits.dim() >= 1 && c.logits.sym_size(-1) == w.sym_size(0) &&
                              c.logits.sym_numel() == target.sym_numel() * w.sym_size(0) &&
                              c.logits.scalar_type() == at::result_type(input, w)),
      "memslim::linear_cross_entropy: logits must be linear(input, weight, bias): "
      "[..., vocab], one row per target, in the linear's dtype");
}

// aten's "Target N is out of bounds." where values can be read (the CPU).
void check_targets(const at::Tensor& t, const at::Tensor& valid, int64_t vocab) {
  if (!plain_cpu(t) || t.numel() == 0) return;
  const at::Tensor bad = ((t < 0) | (t >= vocab)).logical_and_(valid);
  if (bad.any().item<bool>()) {
    const int64_t first = t.masked_select(bad)[0].item<int64_t>();
    TORCH_CHECK_INDEX(false, "Target ", first, " is out of bounds.");
  }
}

// One head call's rows: the input as [rows, d], the targets flat, which rows
// count and their targets with ignored ones at 0.
struct Rows {
  at::Tensor h, t, valid, safe_t;
  int64_t rows = 0, vocab = 0, step = 1;
  at::ScalarType zt, op; // the logits' dtype and its opmath
};

Rows rows_of(const at::Tensor& input, const at::Tensor& w, const at::Tensor& target,
             const LceCall& c, at::ScalarType op) {
  Rows r;
  r.h = input.reshape({-1, input.size(-1)});
  r.t = target.reshape({-1});
  r.rows = r.h.size(0);
  r.vocab = w.size(0);
  r.zt = logits_type(input, c);
  // a chunk's bytes per logit: the linear's output where the rows kernel reads
  // it in place (fp32, bf16) and, for a 16-bit weight, the fp32 copy of the
  // logits' gradient its fp32 weight-gradient accumulation reads; else the
  // logits' opmath copy beside the linear's output
  const int64_t in_bytes = c10::elementSize(input.scalar_type());
  const int64_t held = input.scalar_type() == at::kBFloat16 && op == at::kFloat
                           ? in_bytes + (w.scalar_type() != op ? 4 : 0)
                           : in_bytes + (input.scalar_type() != op ? c10::elementSize(op) : 0);
  r.step = rows_per_chunk(r.rows, r.h.size(1), held, c.chunk);
  r.op = op;
  r.valid = r.t != c.ignore_index;
  r.safe_t = r.t.masked_fill(r.valid.logical_not(), 0);
  return r;
}

// The loss's gradient per row for `grad` (both terms share the reduction's
// divisor), zero on ignored rows.
at::Tensor row_scale(const at::Tensor& grad, const Rows& r, const LceCall& c) {
  const at::Tensor valid_f = r.valid.to(r.op), g = grad.to(r.op);
  if (c.reduction == kNone) return g.reshape({-1}) * valid_f;
  if (c.reduction == kSum) return valid_f * g;
  return valid_f * (g / r.valid.sum().to(r.op));
}

// The gradients being accumulated, chunk by chunk (16-bit weights in opmath).
struct Grads {
  at::Tensor gh, gw, gb;
  bool wide = false;
};

Grads grads_for(const Rows& r, const at::Tensor& w, const at::Tensor& b, std::array<bool, 3> mask) {
  Grads g;
  g.wide = w.scalar_type() != r.op;
  if (mask[0]) g.gh = at::empty_like(r.h);
  // the first chunk writes it (linear_backward_chunk at s == 0): no zero fill
  // of a weight-sized buffer (13 ms at 32,000 x 512); no rows, no chunk: zeros
  if (mask[1]) {
    const auto opts = w.options().dtype(g.wide ? r.op : w.scalar_type());
    g.gw = r.rows > 0 ? at::empty(w.sizes(), opts) : at::zeros(w.sizes(), opts);
  }
  if (mask[2] && b.defined()) g.gb = at::zeros(b.sizes(), b.options().dtype(r.op));
  return g;
}

// linear's backward on one chunk of the logits' gradient `gl` (the linear's
// dtype): the input's rows of the gradient, and the weight's and bias's
// gradients accumulated in place.
void linear_backward_chunk(const Rows& r, const at::Tensor& w, const at::Tensor& gl, int64_t s,
                           int64_t n, Grads& out) {
  const at::Tensor hc = r.h.narrow(0, s, n);
  if (out.gh.defined()) {
    at::Tensor rows_out = out.gh.narrow(0, s, n);
    at::mm_out(rows_out, gl, w);
  }
  if (out.gw.defined()) {
    // aten's 16-bit mm accumulates in fp32 and rounds once: so do the chunks
    const at::Tensor a = out.wide ? gl.t().to(r.op) : gl.t(), x = out.wide ? hc.to(r.op) : hc;
    if (s == 0)
      at::mm_out(out.gw, a, x); // the first chunk: gw is uninitialised (grads_for)
    else
      out.gw.addmm_(a, x);
  }
  if (out.gb.defined()) out.gb.add_(gl.sum(0, false, r.op));
}

// One chunk's logits' gradient, in opmath, per row: scale * (softmax - (1 -
// eps) * one-hot - eps / vocab), from `gz` = scale * softmax (the caller's,
// written in place); then linear's backward on the chunk in the linear's
// dtype. Rows whose log-sum-exp is not finite get NaN from the caller's
// scale, ignored ones too (aten's log_softmax backward multiplies their NaN
// softmax by zero).
void chunk_backward(const Rows& r, const at::Tensor& w, at::Tensor gz, const at::Tensor& scale,
                    int64_t s, int64_t n, double eps, Grads& out) {
  gz.scatter_add_(1, r.safe_t.narrow(0, s, n).unsqueeze(1), (scale * -(1.0 - eps)).unsqueeze(1));
  if (eps > 0) gz.sub_((scale * (eps / static_cast<double>(r.vocab))).unsqueeze(1));
  linear_backward_chunk(r, w, gz.to(r.h.scalar_type()), s, n, out);
}

// Whether a chunk's rows go through kernels/' softmax_rows_cpu: real CPU
// logits, contiguous, stored in fp32 or bf16 with fp32 math, and the model's
// cast (if any) to fp32 (a cast down would round the logits first), on a
// vector build of the loops.
bool rows_kernel(const at::Tensor& z, const Rows& r) {
  const auto zd = z.scalar_type();
  return plain_cpu(z) && z.is_contiguous() && r.op == at::kFloat &&
         (zd == at::kFloat || zd == at::kBFloat16) && (r.zt == zd || r.zt == at::kFloat) &&
         kernels::cpu_loops_vectorised();
}

// The kernel's scratch and arguments for one call of the op.
struct RowsPass {
  at::Tensor tl, scale, lse, picked, zsum; // targets as int64, per-row fp32 values
  double eps = 0;
};

RowsPass rows_pass_for(const Rows& r, const at::Tensor& scale, const at::Tensor& lse,
                       const at::Tensor& zsum, double eps) {
  RowsPass p;
  p.tl = r.safe_t.to(at::kLong).contiguous();
  p.scale = scale.defined() ? scale.to(at::kFloat).contiguous() : at::Tensor();
  p.lse = lse;
  p.picked = at::empty({r.rows}, r.h.options().dtype(at::kFloat));
  p.zsum = zsum;
  p.eps = eps;
  return p;
}

// Rows [s, s + n) of the op through the kernel, `z` their logits (the linear's
// output, the model's cast to fp32 folded in): their log-sum-exp, picked logit
// and logits' sum into p's rows; with a scale, z becomes the logits' gradient.
void rows_pass(at::Tensor& z, const Rows& r, RowsPass& p, int64_t s, int64_t n) {
  kernels::SoftmaxRowsArgs a;
  a.z = z.data_ptr();
  a.vocab = r.vocab;
  a.target = p.tl.data_ptr<int64_t>() + s;
  a.scale = p.scale.defined() ? p.scale.data_ptr<float>() + s : nullptr;
  a.eps = static_cast<float>(p.eps);
  a.lse = p.lse.data_ptr<float>() + s;
  a.picked = p.picked.data_ptr<float>() + s;
  a.zsum = p.zsum.defined() ? p.zsum.data_ptr<float>() + s : nullptr;
  const auto dt =
      z.scalar_type() == at::kBFloat16 ? kernels::DType::BFloat16 : kernels::DType::Float;
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { kernels::softmax_rows_cpu(dt, a, b, e); });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> finish(Grads g, const at::Tensor& input,
                                                      const at::Tensor& w, const at::Tensor& b) {
  if (g.gh.defined()) g.gh = g.gh.reshape(input.sizes());
  if (g.gw.defined() && g.wide) g.gw = g.gw.to(w.scalar_type());
  if (g.gb.defined()) g.gb = g.gb.to(b.scalar_type());
  return {g.gh, g.gw, g.gb};
}

// The loss from each row's log-sum-exp, picked logit and (label smoothing)
// -sum_j log_softmax(z)_j, as aten reduces them.
at::Tensor reduce_loss(at::Tensor nll, at::Tensor smooth, const Rows& r, const at::Tensor& target,
                       const LceCall& c) {
  const at::Tensor invalid = r.valid.logical_not();
  nll.masked_fill_(invalid, 0);
  auto reduce = [&](const at::Tensor& x) {
    if (c.reduction == kNone) return x;
    if (c.reduction == kSum) return x.sum();
    return x.sum() / r.valid.sum().to(r.op);
  };
  at::Tensor loss = reduce(nll);
  if (smooth.defined()) {
    smooth.masked_fill_(invalid, 0);
    loss =
        loss * (1.0 - c.smoothing) + reduce(smooth) * (c.smoothing / static_cast<double>(r.vocab));
  }
  if (c.reduction == kNone) loss = loss.reshape(target.sizes());
  return loss.to(r.zt);
}

// The forward, chunk by chunk: the loss and each row's log-sum-exp; with
// `mask`, also the gradients for a loss gradient of one (grads in forward).
struct Forward {
  at::Tensor loss, lse;
  Grads grads;
};

Forward lce_forward(const at::Tensor& input, const at::Tensor& w, const at::Tensor& b,
                    const at::Tensor& target, const LceCall& c, std::array<bool, 3> mask) {
  check_args(input, w, target, c);
  const Rows r = rows_of(input, w, target, c, at::toOpMathType(logits_type(input, c)));
  check_targets(r.t, r.valid, r.vocab);
  const auto opts = input.options().dtype(r.op);
  Forward f;
  f.lse = at::empty({r.rows}, opts);
  at::Tensor nll = at::empty({r.rows}, opts);
  at::Tensor smooth = c.smoothing > 0 ? at::empty({r.rows}, opts) : at::Tensor();
  const bool grads = mask[0] || mask[1] || mask[2];
  const at::Tensor scale = grads ? row_scale(at::ones({}, opts), r, c) : at::Tensor();
  f.grads = grads_for(r, w, b, mask);
  std::optional<RowsPass> kp;
  // Given logits: each chunk a copy (the chunk's gradient is written over it).
  const at::Tensor given =
      c.logits.defined() ? c.logits.reshape({-1, c.logits.size(-1)}) : at::Tensor();
  for (int64_t s = 0; s < r.rows; s += r.step) {
    const int64_t n = std::min(r.step, r.rows - s);
    at::Tensor z = given.defined() ? given.narrow(0, s, n).clone(at::MemoryFormat::Contiguous)
                                   : chunk_linear(r.h.narrow(0, s, n), w, b);
    if (rows_kernel(z, r)) {
      if (!kp) kp = rows_pass_for(r, scale, f.lse, smooth, c.smoothing);
      rows_pass(z, r, *kp, s, n);
      const at::Tensor lse_c = f.lse.narrow(0, s, n);
      nll.narrow(0, s, n).copy_((lse_c - kp->picked.narrow(0, s, n)).add_(lse_c - lse_c));
      // -sum_j log_softmax(z)_j = vocab * lse - sum_j z_j
      if (smooth.defined()) smooth.narrow(0, s, n).neg_().add_(lse_c * r.vocab);
      if (grads) linear_backward_chunk(r, w, z, s, n, f.grads);
      continue;
    }
    // zf: a temporary of this chunk (z itself in opmath), overwritten below.
    if (c.logits_dtype && *c.logits_dtype != z.scalar_type()) z = z.to(*c.logits_dtype);
    at::Tensor zf = z.to(r.op);
    z.reset();
    const at::Tensor picked = zf.gather(1, r.safe_t.narrow(0, s, n).unsqueeze(1)).squeeze(1);
    if (smooth.defined()) smooth.narrow(0, s, n).copy_(zf.sum(1).neg_());
    // exp(z - max) once: the log-sum-exp and, scaled, the softmax.
    const at::Tensor m = zf.amax({1}, true);
    const at::Tensor e = zf.sub_(m).exp_();
    const at::Tensor sum = e.sum(1);
    const at::Tensor lse_c = m.squeeze(1) + sum.log();
    f.lse.narrow(0, s, n).copy_(lse_c);
    // + (lse - lse): NaN where a logit is +inf, as log_softmax's inf - inf.
    nll.narrow(0, s, n).copy_((lse_c - picked).add_(lse_c - lse_c));
    // -sum_j log_softmax(z)_j = vocab * lse - sum_j z_j
    if (smooth.defined()) smooth.narrow(0, s, n).add_(lse_c * r.vocab);
    if (grads) {
      const at::Tensor sc = scale.narrow(0, s, n) + (lse_c - lse_c);
      chunk_backward(r, w, e.mul_((sc / sum).unsqueeze(1)), sc, s, n, c.smoothing, f.grads);
    }
  }
  f.loss = reduce_loss(nll, smooth, r, target, c);
  return f;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lce_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& w, const at::Tensor& b,
    const at::Tensor& target, const at::Tensor& lse, const LceCall& c, std::array<bool, 3> mask) {
  const Rows r = rows_of(input, w, target, c, lse.scalar_type());
  const at::Tensor scale = row_scale(grad, r, c);
  Grads g = grads_for(r, w, b, mask);
  std::optional<RowsPass> kp;
  for (int64_t s = 0; s < r.rows; s += r.step) {
    const int64_t n = std::min(r.step, r.rows - s);
    at::Tensor z = chunk_linear(r.h.narrow(0, s, n), w, b);
    if (rows_kernel(z, r)) { // the log-sum-exp again, from the same logits: the forward's
      if (!kp) kp = rows_pass_for(r, scale, at::empty_like(lse), at::Tensor(), c.smoothing);
      rows_pass(z, r, *kp, s, n);
      linear_backward_chunk(r, w, z, s, n, g);
      continue;
    }
    if (c.logits_dtype && *c.logits_dtype != z.scalar_type()) z = z.to(*c.logits_dtype);
    const at::Tensor lse_c = lse.narrow(0, s, n);
    const at::Tensor sc = scale.narrow(0, s, n) + (lse_c - lse_c);
    at::Tensor zf = z.to(r.op);
    z.reset();
    chunk_backward(r, w, zf.sub_(lse_c.unsqueeze(1)).exp_().mul_(sc.unsqueeze(1)), sc, s, n,
                   c.smoothing, g);
  }
  return finish(std::move(g), input, w, b);
}

LceCall make_call(int64_t reduction, int64_t ignore_index, double smoothing,
                  std::optional<at::ScalarType> logits_dtype, int64_t chunk,
                  const std::optional<at::Tensor>& logits = std::nullopt) {
  return LceCall{reduction,    ignore_index, smoothing,
                 logits_dtype, chunk,        logits && logits->defined() ? *logits : at::Tensor()};
}

at::Tensor or_empty(const std::optional<at::Tensor>& b) {
  return b && b->defined() ? *b : at::Tensor();
}

// Kernels of the internal ops: device-generic (aten ops) and Meta.
#define MEMSLIM_LCE_ARGS                                                                   \
  const at::Tensor &input, const at::Tensor &w, const std::optional<at::Tensor>&b,         \
      const at::Tensor &target, int64_t reduction, int64_t ignore_index, double smoothing, \
      std::optional<at::ScalarType> logits_dtype, int64_t chunk
#define MEMSLIM_LCE_CALL make_call(reduction, ignore_index, smoothing, logits_dtype, chunk)
#define MEMSLIM_LCE_GIVEN make_call(reduction, ignore_index, smoothing, logits_dtype, chunk, logits)

std::tuple<at::Tensor, at::Tensor> forward_impl(MEMSLIM_LCE_ARGS,
                                                const std::optional<at::Tensor>& logits) {
  Forward f = lce_forward(input, w, or_empty(b), target, MEMSLIM_LCE_GIVEN, {false, false, false});
  return {f.loss, f.lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_impl(
    MEMSLIM_LCE_ARGS, std::array<bool, 3> mask, const std::optional<at::Tensor>& logits) {
  Forward f = lce_forward(input, w, or_empty(b), target, MEMSLIM_LCE_GIVEN, mask);
  auto [gh, gw, gb] = finish(std::move(f.grads), input, w, or_empty(b));
  return {f.loss, gh, gw, gb};
}

at::Tensor loss_meta(const at::Tensor& input, const at::Tensor& w, const at::Tensor& target,
                     const LceCall& c) {
  check_args(input, w, target, c);
  const auto opts = input.options().dtype(logits_type(input, c));
  return c.reduction == kNone ? at::empty_symint(target.sym_sizes(), opts) : at::empty({}, opts);
}

std::tuple<at::Tensor, at::Tensor> forward_meta(MEMSLIM_LCE_ARGS,
                                                const std::optional<at::Tensor>& logits) {
  const LceCall c = MEMSLIM_LCE_GIVEN;
  const at::Tensor loss = loss_meta(input, w, target, c);
  return {loss, at::empty_symint({target.sym_numel()},
                                 loss.options().dtype(at::toOpMathType(loss.scalar_type())))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grads_meta(const at::Tensor& input,
                                                          const at::Tensor& w,
                                                          const std::optional<at::Tensor>& b,
                                                          std::array<bool, 3> mask) {
  return {mask[0] ? at::empty_like(input) : at::Tensor(),
          mask[1] ? at::empty_like(w) : at::Tensor(),
          mask[2] && b && b->defined() ? at::empty_like(*b) : at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_meta(
    MEMSLIM_LCE_ARGS, std::array<bool, 3> mask, const std::optional<at::Tensor>& logits) {
  auto [gh, gw, gb] = grads_meta(input, w, b, mask);
  return {loss_meta(input, w, target, MEMSLIM_LCE_GIVEN), gh, gw, gb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_impl(const at::Tensor& grad,
                                                             MEMSLIM_LCE_ARGS,
                                                             const at::Tensor& lse,
                                                             std::array<bool, 3> mask) {
  return lce_backward(grad, input, w, or_empty(b), target, lse, MEMSLIM_LCE_CALL, mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_meta(const at::Tensor& grad,
                                                             MEMSLIM_LCE_ARGS,
                                                             const at::Tensor& lse,
                                                             std::array<bool, 3> mask) {
  return grads_meta(input, w, b, mask);
}

// The internal ops through the dispatcher (torch.compile traces them as calls).
template <typename Fn>
c10::TypedOperatorHandle<Fn> internal_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

std::optional<at::Tensor> opt(const at::Tensor& b) {
  return b.defined() ? std::optional<at::Tensor>(b) : std::nullopt;
}

// The call's arguments kept for backward.
void save_call(AutogradContext* ctx, const LceCall& c, bool has_bias) {
  ctx->saved_data["reduction"] = c.reduction;
  ctx->saved_data["ignore_index"] = c.ignore_index;
  ctx->saved_data["smoothing"] = c.smoothing;
  ctx->saved_data["logits_dtype"] =
      c.logits_dtype ? c10::IValue(static_cast<int64_t>(*c.logits_dtype)) : c10::IValue();
  ctx->saved_data["chunk"] = c.chunk;
  ctx->saved_data["has_bias"] = has_bias;
}

LceCall saved_call(AutogradContext* ctx) {
  const c10::IValue ld = ctx->saved_data["logits_dtype"];
  return make_call(ctx->saved_data["reduction"].toInt(), ctx->saved_data["ignore_index"].toInt(),
                   ctx->saved_data["smoothing"].toDouble(),
                   ld.isNone()
                       ? std::nullopt
                       : std::optional<at::ScalarType>(static_cast<at::ScalarType>(ld.toInt())),
                   ctx->saved_data["chunk"].toInt());
}

void no_double_backward() {
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "memslim::linear_cross_entropy: double backward is not supported (the backward "
              "recomputes the logits); use the aten ops where higher-order gradients are needed");
}

// Recomputing backward: keeps the input, targets and log-sum-exp.
struct LceFunction : public torch::autograd::Function<LceFunction> {
  // `logits` (given, or an empty placeholder) is an input the op gives no gradient.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& w,
                            const at::Tensor& b_arg, const at::Tensor& target, const LceCall& c,
                            bool has_bias, const at::Tensor& logits) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = internal_op<decltype(forward_impl)>("memslim::linear_cross_entropy_forward");
    auto [loss, lse] = op.call(input, w, has_bias ? opt(b_arg) : std::nullopt, target, c.reduction,
                               c.ignore_index, c.smoothing, c.logits_dtype, c.chunk, opt(c.logits));
    ctx->save_for_backward({input, w, b_arg, target, lse});
    save_call(ctx, c, has_bias);
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward();
    const at::Tensor& g = grads[0];
    if (!g.defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), {}, {}, at::Tensor()};
    auto s = ctx->get_saved_variables();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const LceCall c = saved_call(ctx);
    static auto op = internal_op<decltype(backward_impl)>("memslim::linear_cross_entropy_backward");
    auto [gh, gw, gb] = op.call(
        g, s[0], s[1], has_bias ? opt(s[2]) : std::nullopt, s[3], c.reduction, c.ignore_index,
        c.smoothing, c.logits_dtype, c.chunk, s[4],
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), has_bias && ctx->needs_input_grad(2)});
    return {gh, gw, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Gradients in forward (a scalar loss): the forward's chunks also compute the
// gradients for a loss gradient of one, kept for backward, which scales them
// (returns them as they are for a gradient of exactly one where its value can
// be read: no copy). Three matmuls of the head, as aten's; keeps the
// gradients (the size of the input and the weight) instead of the logits.
struct LceGradsFunction : public torch::autograd::Function<LceGradsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& w,
                            const at::Tensor& b_arg, const at::Tensor& target, const LceCall& c,
                            bool has_bias, std::array<bool, 3> mask, const at::Tensor& logits) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = internal_op<decltype(fused_impl)>("memslim::linear_cross_entropy_fused");
    auto [loss, gh, gw, gb] =
        op.call(input, w, has_bias ? opt(b_arg) : std::nullopt, target, c.reduction, c.ignore_index,
                c.smoothing, c.logits_dtype, c.chunk, mask, opt(c.logits));
    ctx->save_for_backward({gh, gw, gb});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward();
    const at::Tensor& g = grads[0];
    variable_list out{at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
                      {},           {},           {},           at::Tensor()};
    if (!g.defined()) return out;
    auto s = ctx->get_saved_variables();
    const bool one = real_data(g) && g.numel() == 1 && g.item<double>() == 1.0;
    for (size_t i = 0; i < 3; ++i)
      if (s[i].defined() && ctx->needs_input_grad(i))
        out[i] = one ? s[i] : s[i] * g.to(s[i].scalar_type());
    return out;
  }
};

at::Tensor lce_plain(MEMSLIM_LCE_ARGS, bool grads_in_forward,
                     const std::optional<at::Tensor>& logits) {
  static auto op = internal_op<decltype(forward_impl)>("memslim::linear_cross_entropy_forward");
  return std::get<0>(op.call(input, w, b, target, reduction, ignore_index, smoothing, logits_dtype,
                             chunk, logits));
}

at::Tensor lce_autograd(MEMSLIM_LCE_ARGS, bool grads_in_forward,
                        const std::optional<at::Tensor>& logits) {
  const LceCall c = MEMSLIM_LCE_GIVEN;
  const at::Tensor bias = or_empty(b);
  const std::array<bool, 3> mask{input.requires_grad(), w.requires_grad(),
                                 bias.defined() && bias.requires_grad()};
  if (!at::GradMode::is_enabled() || !(mask[0] || mask[1] || mask[2])) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return lce_plain(input, w, b, target, reduction, ignore_index, smoothing, logits_dtype, chunk,
                     grads_in_forward, logits);
  }
  const at::Tensor b_arg = bias.defined() ? bias : at::empty({0}, input.options());
  const at::Tensor z_arg = c.logits.defined() ? c.logits : at::empty({0}, input.options());
  if (grads_in_forward && reduction != kNone)
    return LceGradsFunction::apply(input, w, b_arg, target, c, bias.defined(), mask, z_arg);
  return LceFunction::apply(input, w, b_arg, target, c, bias.defined(), z_arg);
}

#undef MEMSLIM_LCE_ARGS
#undef MEMSLIM_LCE_CALL
#undef MEMSLIM_LCE_GIVEN

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) { m.impl("linear_cross_entropy", TORCH_FN(lce_autograd)); }

TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("linear_cross_entropy", TORCH_FN(lce_plain));
  m.impl("linear_cross_entropy_forward", TORCH_FN(forward_impl));
  m.impl("linear_cross_entropy_fused", TORCH_FN(fused_impl));
  m.impl("linear_cross_entropy_backward", TORCH_FN(backward_impl));
}

TORCH_LIBRARY_IMPL(memslim, Meta, m) {
  m.impl("linear_cross_entropy_forward", TORCH_FN(forward_meta));
  m.impl("linear_cross_entropy_fused", TORCH_FN(fused_meta));
  m.impl("linear_cross_entropy_backward", TORCH_FN(backward_meta));
}

} // namespace memslim
