//===- schema.cpp - the memslim op library: one schema per op --------------===//
//
// Every public op has aten's functional signature, so rewriting an activation
// is a namespace swap that keeps every argument. Each runs on CPU, CUDA (in
// CUDA builds) and Meta, and its Autograd kernel keeps less for backward than
// aten: the output (+ 1 bit per element and an exact list near the minimum for
// non-monotonic functions), or only a 1-bit mask where the derivative does not
// depend on the output.
//
//===----------------------------------------------------------------------===//
#include <torch/library.h>

TORCH_LIBRARY(memslim, m) {
  // The public activation ops: one row each in activation_table.def (what
  // each keeps is written there).
#define MEMSLIM_OP(NAME, ENUM, ARGS, ATEN_KEEPS, INPLACE_KEEPS, WORK) \
  m.def(#NAME "(" ARGS ") -> Tensor");
#include "memslim/kernels/activation_table.def"

  // The public norm ops: one row each in norm_table.def. Each keeps its output
  // and per-group rstd instead of its input (norm_ops.cpp says how it stays exact).
#define MEMSLIM_NORM(NAME, ARGS, ...) m.def(#NAME "(" ARGS ") -> Tensor");
#include "memslim/kernels/norm_table.def"

  // The residual joins: act(residual) + NAME(input, ...) ("none": residual
  // itself), the norm's signature after three arguments (first: the norm's have
  // defaults). Each keeps its output and `residual` (and per-group rstd) instead
  // of the norm's input; backward rebuilds the norm's output as
  // out - act(residual) (norm_ops.cpp).
#define MEMSLIM_NORM(NAME, ARGS, ...)                                                  \
  m.def(#NAME "_add(Tensor residual, str residual_act, float[] residual_params, " ARGS \
              ") -> Tensor");
#include "memslim/kernels/norm_table.def"

  // A linear / conv of act(input): one row each in consumer_table.def. `act`
  // and `params` as in activation_forward. Keeps the input and the weight, not
  // act(input); backward recomputes act(input) (aten's values, bit for bit).
#define MEMSLIM_CONSUMER(NAME, ARGS, ...) \
  m.def("act_" #NAME "(" ARGS ", str act, float[] params) -> Tensor");
#include "memslim/kernels/consumer_table.def"

  // aten::max_pool2d keeping only the position of each maximum in its window
  // (int8 / int16), not the input and int64 indices (pool_ops.cpp).
  m.def(
      "max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, "
      "int[2] dilation=1, bool ceil_mode=False) -> Tensor");

  // dropout(act(x), p, train) as one op (what fuse-activation-dropout emits). `act`
  // and `params` as in activation_forward. Keeps the output (which the next layer
  // keeps anyway) plus 1 bit/element of dropout mask and the activation's bit and
  // exact list, instead of aten's activation input and float dropout noise. The
  // mask comes from the same RNG calls aten's dropout makes, so a seeded run
  // reproduces aten's values exactly.
  // It draws random numbers, which TorchScript cannot be told for an op outside
  // aten (Node::isNondeterministic reads aten's list only): its CSE merged two
  // such ops on one input into one mask. `instance` (ignored by the kernels)
  // differs between the fused ops of a graph, so no two are ever equal nodes.
  // (Registering the op as one with effects also stops CSE, but makes AliasDb
  // assume it writes every input: the executor then grouped differentiable
  // nodes differently and backward failed on a fuzzer program.)
  m.def(
      "activation_dropout(Tensor self, str act, float[] params, float p, bool train, "
      "int instance=0) -> Tensor");

  // A region of elementwise ops (what recompute-pointwise-regions cuts out), as
  // TorchScript IR text taking `inputs` in order and returning the outputs.
  // Autograd keeps only `inputs`; backward re-runs the region with grad and
  // differentiates it. The string is parsed once per process and cached.
  m.def("recompute_region(Tensor[] inputs, str graph) -> Tensor[]");

  // K coupling blocks y1 = x1 (+) F_b(x2), y2 = x2 (+) G_b(y1) (what
  // invertible-couplings cuts out): `fns` = [F_1, G_1, ..., F_K, G_K] as
  // TorchScript IR texts taking (block input, their `arity` entries of `state`
  // in order) and returning one Tensor f, or two (m, t) where the function's
  // `combine` code (empty: all 0) is 1 (y = x * m + t) or 2 (y = (x + t) * m)
  // rather than 0 (y = x + f); `links` = (kind, d1, d2) per link
  // between blocks (0: the outputs are the next inputs; 1: chunk(cat([y1, y2],
  // d1), 2, d2)). Autograd keeps the final outputs (and the exact inputs of every
  // `anchor_every`-th block, of blocks that cannot be inverted, and of blocks
  // whose rebuilt input was off by more than `drift_bound` on the first call);
  // backward rebuilds each block's inputs in reverse (coupling_chain.cpp).
  m.def(
      "coupling_chain(Tensor x1, Tensor x2, Tensor?[] state, str[] fns, int[] arity, "
      "int[] links, int anchor_every=0, float drift_bound=1e-05, int[] combine=[]) -> "
      "(Tensor, Tensor)");

  // A block of the user's model (a residual block, a transformer sub-layer, a
  // run of them: what recompute-blocks and the memory-budget planner cut out)
  // as TorchScript IR text taking (x, the entries of `state` in order) and
  // returning one Tensor. Autograd keeps x and `state` only; backward re-runs
  // the block with grad (running-stat writes on copies, random ops on the
  // forward's generator state) and differentiates it (recompute_block.cpp).
  // `strs`: the str values the block reads (torchvision's StochasticDepth
  // mode), the function's last inputs, in order.
  m.def("recompute_block(Tensor x, Tensor?[] state, str fn, str[]? strs=None) -> Tensor");

  // Internal: the forward that also produces what backward needs. `act` is a
  // kernel activation name (gelu, gelu_tanh, silu, ..., elu for celu/selu),
  // `params` its parameters (padded to three and followed by a fourth when the
  // caller saves out * params[3], as activation_dropout does: elements whose
  // saved value would overflow the dtype join the exact list). Returns (out,
  // packed bits, exact-list indices
  // (int32, memory order), exact-list input values); with save=False the last
  // three are empty. The exact list has a data-dependent length.
  m.def(
      "activation_forward(Tensor self, str act, float[] params, bool save) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
  // Internal: dL/dx from dL/dy, the saved output (None for mask-only
  // activations), bits and exact list. grad and out share one dense layout.
  m.def(
      "activation_backward(Tensor grad, Tensor? out, Tensor bits, Tensor exact_idx, "
      "Tensor exact_val, str act, float[] params) -> Tensor");
  // Internal: the channels (affine elements) of a norm whose gamma cannot be
  // inverted within the error bound for `out_dtype` (int32 indices) and x_hat
  // there, (A, k, S) in opmath, A the dims before the affine ones and S those
  // after. `norm` is a norm_table.def name; `normalized_dims` counts
  // layer/rms_norm's trailing dims, `groups` group_norm's. Data-dependent length.
  m.def(
      "norm_fallback(Tensor input, Tensor? mean, Tensor rstd, Tensor? weight, Tensor? bias, "
      "str norm, int normalized_dims, int groups, ScalarType out_dtype) -> (Tensor, Tensor)");
}

// The loss head's and the gated MLP's ops (a fragment of the same library, so
// each block stays readable).
TORCH_LIBRARY_FRAGMENT(memslim, m) {
  // linear(act(gate) * up, weight, bias), keeping gate and up (gated_ops.cpp):
  // a gated MLP's down projection; `act`, `params` as act_linear's.
  m.def(
      "gated_linear(Tensor gate, Tensor up, Tensor weight, Tensor? bias, str act, "
      "float[] params) -> Tensor");
  // The loss head without its logits (loss_head_ops.cpp): aten's
  // cross_entropy(linear(input, weight, bias)[.to(logits_dtype)], target,
  // None, reduction, ignore_index, label_smoothing) for class-index targets,
  // `chunk` rows at a time (0: the op picks). Keeps the input, the targets and
  // one log-sum-exp per row; backward recomputes each chunk's logits. `logits`,
  // when given, must be linear(input, weight, bias) as the graph computed it
  // (a head whose logits the graph also returns): the op reads their chunks in
  // place of the forward's matmul and gives them no gradient (the loss's flows
  // to input, weight and bias directly; memslim::linear's backward sees only
  // the logits' other readers').
  m.def(
      "linear_cross_entropy(Tensor input, Tensor weight, Tensor? bias, Tensor target, "
      "int reduction=1, int ignore_index=-100, float label_smoothing=0.0, "
      "ScalarType? logits_dtype=None, int chunk=0, bool grads_in_forward=True, "
      "Tensor? logits=None) -> Tensor");
  // aten's linear whose backward spends no matmul on an undefined or all-zero
  // gradient (linear_ops.cpp): the linear of a loss head whose logits the graph
  // returns. Internal: its backward (input, weight, bias gradients as
  // output_mask asks; zeros for an all-zero gradient).
  m.def("linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor");
  // RoPE's rotate_half, cat([-self[.., split:], self[.., :split]], dim), whose
  // backward keeps no tensor (rotate_half_ops.cpp): fuse-rotate-half's op.
  m.def("rotate_half(Tensor self, int dim, SymInt split) -> Tensor");
  m.def(
      "linear_backward(Tensor grad, Tensor input, Tensor weight, bool[3] output_mask) -> "
      "(Tensor, Tensor, Tensor)");
  // Internal: its forward (loss, log-sum-exp per row in opmath), the forward
  // that also computes the gradients for a loss gradient of one (a scalar loss
  // with grads_in_forward: three matmuls of the head instead of four), and the
  // recomputing backward (input, weight, bias gradients as output_mask asks).
  m.def(
      "linear_cross_entropy_forward(Tensor input, Tensor weight, Tensor? bias, Tensor target, "
      "int reduction, int ignore_index, float label_smoothing, ScalarType? logits_dtype, "
      "int chunk, Tensor? logits=None) -> (Tensor, Tensor)");
  m.def(
      "linear_cross_entropy_fused(Tensor input, Tensor weight, Tensor? bias, Tensor target, "
      "int reduction, int ignore_index, float label_smoothing, ScalarType? logits_dtype, "
      "int chunk, bool[3] output_mask, Tensor? logits=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "linear_cross_entropy_backward(Tensor grad, Tensor input, Tensor weight, Tensor? bias, "
      "Tensor target, int reduction, int ignore_index, float label_smoothing, "
      "ScalarType? logits_dtype, int chunk, Tensor lse, bool[3] output_mask) -> "
      "(Tensor, Tensor, Tensor)");
}

// The draws alone of an unused dropout (memslim's Inductor guard's ops).
TORCH_LIBRARY_FRAGMENT(memslim, m) {
  // A training dropout's draw alone (activation_dropout.cpp): aten's
  // native_dropout(input, p, True) run for its keep-mask, which it returns.
  // memslim's Inductor guard (python/memslim/inductor_guards.py) puts it in
  // place of a native_dropout whose outputs are unused, so that the generator
  // is drawn from in eager's order under fallback_random: one output, which
  // Inductor keeps (the tag makes the op impure) and torch's order edge to it
  // survives, where the edge to a dead native_dropout's two outputs did not.
  m.def("dropout_draw(Tensor input, float p) -> Tensor", {at::Tag::nondeterministic_seeded});
  // The same for an unused aten bernoulli(input, p) (an in-place dropout whose
  // result nothing reads), which Inductor otherwise drops, draw and all.
  m.def("bernoulli_draw(Tensor input, float p) -> Tensor", {at::Tag::nondeterministic_seeded});
}
