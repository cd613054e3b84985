//===- saved_tensor_analysis.cpp - saved-for-backward table for aten ops ---===//
//
// The table follows tools/autograd/derivatives.yaml for the ops that matter
// in vision and transformer models. "Keeps input i" means the backward formula
// of some differentiable input reads input i. Training graphs are assumed:
// every floating tensor may require grad.
//
//===----------------------------------------------------------------------===//
#include "memslim/passes/saved_tensor_analysis.h"

#include <c10/core/ScalarType.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/autodiff.h>

#include <set>

#include "memslim/passes/activation_table.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

namespace {

enum class Rule { None, All, First, FirstTwo, Output, Custom };

// Ops keeping none of their inputs (shape-only or linear backward).
const std::set<std::string> kKeepsNothing = {
    "aten::add", "aten::sub", "aten::rsub", "aten::neg", "aten::view", "aten::reshape", "aten::flatten",
    "aten::permute", "aten::transpose", "aten::t", "aten::contiguous", "aten::unsqueeze",
    "aten::squeeze", "aten::expand", "aten::slice", "aten::select", "aten::cat", "aten::stack",
    "aten::chunk", "aten::split", "aten::size", "aten::sum", "aten::mean",
    "aten::dropout", "aten::feature_dropout",
    "aten::alpha_dropout", "aten::to", "aten::detach", "aten::clone", "aten::zeros_like",
    "aten::ones_like", "aten::empty_like", "aten::dim", "aten::len", "aten::__getitem__",
    "aten::Int", "aten::Float", "aten::ScalarImplicit", "aten::format", "aten::warn",
    "aten::__is__", "aten::__isnot__", "aten::eq", "aten::ne", "aten::lt", "aten::gt",
    "aten::le", "aten::ge", "aten::__not__", "aten::list", "aten::append",
};
// Ops keeping every tensor input.
const std::set<std::string> kKeepsAll = {
    "aten::mul", "aten::div", "aten::matmul", "aten::mm", "aten::bmm", "aten::linear",
    "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::_convolution", "aten::convolution",
    "aten::conv_transpose2d", "aten::einsum", "aten::baddbmm",
};
// Ops keeping their first input (and possibly small statistics). Average
// pooling: aten's backward reads the input (avg_pool2d_backward(grad, self)).
// adaptive_avg_pool2d: see adaptive_pool_keeps_input.
const std::set<std::string> kKeepsFirst = {
    "aten::avg_pool2d", "aten::avg_pool1d", "aten::adaptive_avg_pool1d",
    "aten::batch_norm", "aten::layer_norm", "aten::group_norm", "aten::instance_norm",
    "aten::max_pool2d", "aten::max_pool1d", "aten::log",
    "aten::abs", "aten::sin", "aten::cos", "aten::erf",
    "aten::clamp", "aten::hardtanh", "aten::relu6", "aten::lgamma",
};
// Ops keeping their output (sqrt, rsqrt, reciprocal: measured with
// saved_tensors_hooks; they were listed as keeping their input).
const std::set<std::string> kKeepsOutput = {
    "aten::softmax", "aten::log_softmax", "aten::exp", "aten::sqrt", "aten::rsqrt",
    "aten::reciprocal",
};

bool is_tensor(const Value* v) { return v->type()->cast<c10::TensorType>() != nullptr; }

// adaptive_avg_pool2d: eager's pool to 1x1 is a mean that keeps nothing (any
// other size keeps the input); TorchScript's symbolic gradient keeps the input
// whenever the executor puts the pool in a DifferentiableGraph, which needs a
// neighbour its autodiff differentiates. Its producer is the activation being
// priced (rewritten to a memslim op, which autodiff does not differentiate), so
// a differentiable consumer decides: timm's head pool -> dropout(p=0) kept the
// input (resnetv2_50x1_bit: the relu's bits added 2,048 B); torchvision's pool ->
// flatten did not (measured: the relu rewrite frees its full output).
bool adaptive_pool_keeps_input(const Node* pool) {
  const auto size = torch::jit::toIValue(pool->input(1));
  bool to_one = false;
  if (size && size->isIntList()) {
    const auto v = size->toIntVector();
    to_one = !v.empty();
    for (int64_t d : v) to_one = to_one && d == 1;
  }
  if (!to_one) return true;
  for (const auto& use : pool->output()->uses()) {
    const Node* u = use.user;
    const c10::FunctionSchema* s = u->maybeSchema();
    if (u->owningBlock() == pool->owningBlock() && torch::jit::isDifferentiable(u) &&
        !(s && s->is_mutable()))
      return true;
  }
  return false;
}

} // namespace

bool SavedTensorAnalysis::keeps_input(const Node* user, size_t index) {
  if (!is_tensor(user->input(index))) return false;
  const c10::Symbol kind = user->kind();
  if (auto info = activation_info(kind)) {
    const Keeps k = kind == info->aten ? info->aten_keeps : info->memslim_keeps;
    return index == 0 && k == Keeps::Input;
  }
  const std::string name = kind.toQualString();
  if (kind == c10::prim::ListConstruct) {
    // The input list of a recompute region: the region op keeps every element.
    // The input list of aten::cat: TorchScript's optimising executor (where an
    // optimized module runs) differentiates cat with a symbolic script that
    // keeps its input tensors (measured: cat([a, b]) -> mul keeps a and b
    // scripted, not in eager; stack does not). Without this, mask-only ReLU
    // rewrites in front of googlenet/inception's cat added their bits.
    for (const auto& use : user->output()->uses())
      if (use.user->kind() == c10::Symbol::fromQualString("memslim::recompute_region") ||
          use.user->kind() == c10::aten::cat)
        return true;
    return false;
  }
  if (kind.is_prim()) return false;  // Constant, GetAttr, Return...
  if (kKeepsNothing.count(name)) return false;
  if (kind == c10::aten::adaptive_avg_pool2d) return index == 0 && adaptive_pool_keeps_input(user);
  // mul keeps an operand for the other's gradient, div its dividend for the
  // divisor's: a Python-scalar other operand needs neither (`h * 0.5`).
  if (kind == c10::aten::mul && index < 2 && user->inputs().size() >= 2)
    return is_tensor(user->input(1 - index));
  if (kind == c10::aten::div && index == 0 && user->inputs().size() >= 2)
    return is_tensor(user->input(1));
  if (kKeepsAll.count(name)) return true;
  if (kKeepsFirst.count(name)) return index == 0;
  if (kKeepsOutput.count(name)) return false;
  if (name == "aten::where") return index == 0;         // the condition
  if (name == "aten::pow") return true;                 // base and exponent (when tensors)
  if (name == "aten::embedding") return index == 1;     // the indices
  if (name == "aten::addmm") return index >= 1;         // mat1, mat2
  if (kind.ns().toUnqualString() == std::string("memslim")) return false;
  return true;  // unknown op: conservatively keeps every tensor input
}

bool SavedTensorAnalysis::keeps_output(const Node* producer) {
  const c10::Symbol kind = producer->kind();
  if (auto info = activation_info(kind)) {
    const Keeps k = kind == info->aten ? info->aten_keeps : info->memslim_keeps;
    return k == Keeps::Output || k == Keeps::OutputAndBits;
  }
  // pow with a tensor exponent also keeps its result (d/d exponent = result * log(base)).
  if (kind == c10::aten::pow && producer->inputs().size() > 1 &&
      producer->input(1)->type()->cast<c10::TensorType>())
    return true;
  return kKeepsOutput.count(kind.toQualString()) > 0;
}

bool SavedTensorAnalysis::kept_by_other(const Value* v, const Node* except, std::string* who) {
  return kept_by_other(v, std::unordered_set<const Node*>{except}, who);
}

bool SavedTensorAnalysis::kept_by_other(const Value* v, const std::unordered_set<const Node*>& except,
                                        std::string* who) {
  const Node* p = v->node();
  if (!except.count(p) && p->kind() != c10::prim::Param && keeps_output(p)) {
    if (who) *who = p->kind().toQualString();
    return true;
  }
  for (const auto& use : v->uses()) {
    const Node* u = use.user;
    if (except.count(u)) continue;
    if (keeps_input(u, use.offset)) {
      if (who) *who = u->kind().toQualString();
      return true;
    }
    // Returned from an If branch: whoever keeps the If's output keeps this
    // tensor (timm's SE gate: `x.sigmoid_() if inplace else x.sigmoid()`).
    // From a loop body: conservatively kept.
    if (u->kind() == c10::prim::Return && u->owningBlock()->owningNode()) {
      const Node* owner = u->owningBlock()->owningNode();
      if (owner->kind() != c10::prim::If) {
        if (who) *who = owner->kind().toQualString();
        return true;
      }
      if (use.offset < owner->outputs().size() &&
          kept_by_other(owner->output(use.offset), except, who))
        return true;
      continue;
    }
    // A view shares the storage: keeping the view keeps these bytes (GPT-2's
    // Conv1D: addmm keeps `x.view(-1, n)` of the GELU's output).
    if (is_view_of_input(u, use.offset)) {
      for (const Value* o : u->outputs())
        if (is_tensor(o) && kept_by_other(o, except, who)) return true;
    }
  }
  return false;
}

bool SavedTensorAnalysis::is_view_of_input(const Node* n, size_t index) {
  const c10::FunctionSchema* s = n->maybeSchema();
  if (!s || s->returns().empty() || index >= s->arguments().size()) return false;
  const c10::AliasInfo* out = s->returns()[0].alias_info();
  const c10::AliasInfo* in = s->arguments()[index].alias_info();
  return out && in && !out->isWrite() && !in->isWrite() && out->beforeSets() == in->beforeSets();
}

namespace {

// aten's dropouts, functional or in place (one table): ATen's _dropout_impl
// returns its input untouched when p == 0 or not training.
bool is_dropout(const Node* n, bool inplace) {
  static const char* names[] = {"dropout", "feature_dropout", "alpha_dropout",
                                "feature_alpha_dropout"};
  static const auto kinds = [] {
    std::vector<std::pair<c10::Symbol, bool>> k;
    for (const char* name : names)
      for (bool in_place : {false, true})
        k.emplace_back(
            c10::Symbol::fromQualString(std::string("aten::") + name + (in_place ? "_" : "")),
            in_place);
    return k;
  }();
  for (const auto& [k, in_place] : kinds)
    if (n->kind() == k) return in_place == inplace;
  return false;
}

// A dropout's constant p and train arguments, where they are constants.
struct DropoutArgs {
  std::optional<double> p;
  std::optional<bool> train;
};
DropoutArgs dropout_args(const Node* d) {
  DropoutArgs a;
  if (d->inputs().size() < 3) return a;
  if (const auto p = torch::jit::toIValue(d->input(1)); p && p->isDouble()) a.p = p->toDouble();
  if (const auto t = torch::jit::toIValue(d->input(2)); t && t->isBool()) a.train = t->toBool();
  return a;
}

} // namespace

bool SavedTensorAnalysis::returns_input_undeclared(const Node* n) { return is_dropout(n, false); }

namespace {

// Whether scalar `s` may become a constant once TorchScript's executor unrolls
// a loop with a constant trip count: it is computed from a loop's counter with
// scalar arithmetic only (`x * (i + 1)`).
bool from_loop_counter(const Value* s, int depth = 0) {
  if (depth > 8) return false;
  const Node* p = s->node();
  if (p->kind() == c10::prim::Param) {
    const Node* owner = p->owningBlock()->owningNode();
    return owner && owner->kind() == c10::prim::Loop && s->offset() == 0;
  }
  if (p->kind() == c10::prim::Constant || p->inputs().empty()) return false;
  bool any = false;
  for (const Value* in : p->inputs()) {
    if (in->type()->cast<c10::TensorType>()) return false;
    if (in->node()->kind() == c10::prim::Constant) continue;
    if (!from_loop_counter(in, depth + 1)) return false;
    any = true;
  }
  return any;
}

} // namespace

bool SavedTensorAnalysis::may_fold_to_input(const Node* n) {
  const bool scale = n->kind() == c10::aten::mul || n->kind() == c10::aten::div;
  const bool shift = n->kind() == c10::aten::add || n->kind() == c10::aten::sub;
  if ((!scale && !shift) || n->inputs().size() < 2) return false;
  const Value* s = n->input(1);
  if (!n->input(0)->type()->cast<c10::TensorType>() || s->type()->cast<c10::TensorType>())
    return false;
  if (shift && n->inputs().size() > 2 && !torch::jit::toIValue(n->input(2))) return false;
  if (const auto c = torch::jit::toIValue(s)) {
    if (!c->isInt() && !c->isDouble()) return false;
    const double v = c->isInt() ? double(c->toInt()) : c->toDouble();
    return v == (scale ? 1.0 : 0.0);
  }
  return from_loop_counter(s);
}

// The tensor whose storage `v` is: through views (pieces of chunk / split /
// unbind included) and through dropouts, which may return their input.
// `through_dropout` (if given) says whether the way passed such a dropout: an
// alias AliasDb cannot see.
const Value* SavedTensorAnalysis::storage_root(const Value* v, bool* through_dropout,
                                               std::vector<const Node*>* dropouts) {
  static const c10::Symbol pieces[] = {c10::aten::chunk, c10::aten::split, c10::aten::unbind,
                                       c10::Symbol::fromQualString("aten::split_with_sizes")};
  if (through_dropout) *through_dropout = false;
  for (;;) {
    const Node* p = v->node();
    const bool dropout = may_return_input(p);  // a fresh mask's output is its own
    if (is_view_of_input(p, 0) || dropout || may_fold_to_input(p)) {
      if (dropout && through_dropout) *through_dropout = true;
      if (dropout && dropouts) dropouts->push_back(p);
      v = p->input(0);
      continue;
    }
    // An in-place op returns the tensor it wrote (`Tensor(a!) self -> Tensor(a!)`).
    const c10::FunctionSchema* s = p->maybeSchema();
    if (s && !s->returns().empty() && !s->arguments().empty() && !p->inputs().empty() &&
        s->returns()[0].alias_info() && s->returns()[0].alias_info()->isWrite() &&
        s->arguments()[0].alias_info() && s->arguments()[0].alias_info()->isWrite()) {
      v = p->input(0);
      continue;
    }
    // An If whose branch yields an outer tensor may return that tensor itself
    // (F.dropout's `if inplace` in an unfolded graph; a user's `y = x if c else f(x)`).
    if (p->kind() == c10::prim::If) {
      const size_t i = v->offset();
      const Value* outer = nullptr;
      for (const torch::jit::Block* b : p->blocks())
        if (!outer && i < b->outputs().size() && b->outputs()[i]->node()->owningBlock() != b &&
            b->outputs()[i]->type()->cast<c10::TensorType>())
          outer = b->outputs()[i];
      if (outer) {
        v = outer;
        continue;
      }
    }
    if (p->kind() == c10::prim::ListUnpack) {
      const Node* l = p->input(0)->node();
      bool piece = false;
      for (c10::Symbol k : pieces) piece = piece || l->kind() == k;
      if (piece) {
        v = l->input(0);
        continue;
      }
    }
    return v;
  }
}

bool SavedTensorAnalysis::may_return_input(const Node* d) {
  if (!returns_input_undeclared(d) || d->inputs().size() < 3) return false;
  const DropoutArgs a = dropout_args(d);
  const bool fresh = a.p && *a.p > 0 && a.train && *a.train;
  return !fresh;
}

bool SavedTensorAnalysis::draws_random(const Node* n) {
  static const c10::Symbol fused = c10::Symbol::fromQualString("memslim::activation_dropout");
  if (n->kind() == fused) {
    const auto train = n->inputs().size() > 4 ? torch::jit::constant_as<bool>(n->input(4))
                                              : std::optional<bool>();
    return !train || *train;
  }
  return n->isNondeterministic();
}

bool SavedTensorAnalysis::writes_nothing(const Node* n) {
  if (!is_dropout(n, true)) return false;
  const DropoutArgs a = dropout_args(n);
  return (a.p && *a.p == 0) || (a.train && !*a.train);
}

bool SavedTensorAnalysis::has_effects(const Node* n) {
  const c10::Symbol k = n->kind();
  if (k == c10::prim::Constant || k == c10::prim::ListConstruct || k == c10::prim::TupleConstruct ||
      k == c10::prim::ListUnpack || k == c10::prim::TupleUnpack || k == c10::prim::GetAttr)
    return false;
  const c10::FunctionSchema* s = n->maybeSchema();
  if (!s || s->is_mutable()) return true;
  return n->hasSideEffects() || draws_random(n);
}

std::vector<const Value*> SavedTensorAnalysis::written_inputs(const Node* n) {
  std::vector<const Value*> out;
  const c10::FunctionSchema* s = n->maybeSchema();
  if (!s || writes_nothing(n)) return out;
  for (size_t i = 0; i < s->arguments().size() && i < n->inputs().size(); ++i) {
    const c10::AliasInfo* a = s->arguments()[i].alias_info();
    if (a && a->isWrite()) out.push_back(n->input(i));
  }
  return out;
}

std::optional<int64_t> SavedTensorAnalysis::numel(const Value* v) {
  auto t = v->type()->cast<c10::TensorType>();
  if (!t) return std::nullopt;
  auto sizes = t->sizes().concrete_sizes();
  if (!sizes) return std::nullopt;
  int64_t n = 1;
  for (int64_t s : *sizes) n *= s;
  return n;
}

std::optional<int64_t> SavedTensorAnalysis::bytes(const Value* v) {
  auto t = v->type()->cast<c10::TensorType>();
  auto n = numel(v);
  if (!t || !n || !t->scalarType()) return std::nullopt;
  return *n * int64_t(c10::elementSize(*t->scalarType()));
}

} // namespace memslim
