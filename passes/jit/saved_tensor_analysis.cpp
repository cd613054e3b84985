//===- saved_tensor_analysis.cpp - saved-for-backward table for aten ops ---===//
//
// The keep rules (which inputs/outputs autograd keeps, who else keeps a value)
// are the core's, core/saved_tensors.cpp, read here through a JitGraphView.
// What stays here is TorchScript's own: storage roots through its aliasing,
// what its peephole pass may fold, its dropouts' undeclared aliases, effects.
//
//===----------------------------------------------------------------------===//
#include "memslim/jit/saved_tensor_analysis.h"

#include <c10/core/ScalarType.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/autodiff.h>

#include <set>

#include "memslim/core/activation_table.h"
#include "memslim/core/saved_tensors.h"
#include "memslim/jit/jit_graph_view.h"

namespace memslim {

using torch::jit::Node;
using torch::jit::Value;

namespace {
const JitGraphView& view() {
  static const JitGraphView v;
  return v;
}
} // namespace

// The rules live in the core (core/saved_tensors.cpp), over a view of the
// TorchScript graph: the FX front end reads the same ones.
bool SavedTensorAnalysis::keeps_input(const Node* user, size_t index) {
  return saved::keeps_input(view(), JitGraphView::ref(user), index);
}

bool SavedTensorAnalysis::keeps_output(const Node* producer) {
  return saved::keeps_output(view(), JitGraphView::ref(producer));
}

bool SavedTensorAnalysis::kept_by_other(const Value* v, const Node* except, std::string* who) {
  return kept_by_other(v, std::unordered_set<const Node*>{except}, who);
}

bool SavedTensorAnalysis::kept_by_other(const Value* v,
                                        const std::unordered_set<const Node*>& except,
                                        std::string* who) {
  saved::NodeSet ex;
  for (const Node* n : except) ex.insert(JitGraphView::ref(n));
  return saved::kept_by_other(view(), JitGraphView::ref(v), ex, who);
}

bool SavedTensorAnalysis::is_view_of_input(const Node* n, size_t index) {
  return saved::may_alias_input(view(), JitGraphView::ref(n), index);
}

namespace {

// aten's dropouts, functional or in place (the core's table,
// saved::is_dropout_kind): ATen's _dropout_impl returns its input untouched
// when p == 0 or not training.
bool is_dropout(const Node* n, bool inplace) {
  return saved::is_dropout_kind(n->kind().toQualString(), inplace);
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
                                               std::vector<const Node*>* dropouts,
                                               bool* through_branch) {
  static const c10::Symbol pieces[] = {c10::aten::chunk, c10::aten::split, c10::aten::unbind,
                                       c10::Symbol::fromQualString("aten::split_with_sizes")};
  if (through_dropout) *through_dropout = false;
  if (through_branch) *through_branch = false;
  for (;;) {
    const Node* p = v->node();
    const bool dropout = may_return_input(p); // a fresh mask's output is its own
    if (is_view_of_input(p, 0) || dropout || may_fold_to_input(p)) {
      if (dropout && through_dropout) *through_dropout = true;
      if (dropout && dropouts) dropouts->push_back(p);
      v = p->input(0);
      continue;
    }
    // An in-place op returns the tensor it wrote (`Tensor(a!) self -> Tensor(a!)`).
    if (!p->inputs().empty() && saved::returns_written_first(p->maybeSchema())) {
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
        if (through_branch) *through_branch = true;
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
    const auto train =
        n->inputs().size() > 4 ? torch::jit::constant_as<bool>(n->input(4)) : std::optional<bool>();
    return !train || *train;
  }
  return n->isNondeterministic();
}

bool SavedTensorAnalysis::writes_nothing(const Node* n) {
  return is_dropout(n, true) && saved::dropout_is_identity(view(), JitGraphView::ref(n));
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
  return view().numel(JitGraphView::ref(v));
}

std::optional<int64_t> SavedTensorAnalysis::bytes(const Value* v) {
  return view().bytes(JitGraphView::ref(v));
}

} // namespace memslim
