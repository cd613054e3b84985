//===- saved_tensors.cpp - saved-for-backward table for aten ops, any view -===//
//
// The table follows tools/autograd/derivatives.yaml for the ops that matter
// in vision and transformer models. "Keeps input i" means the backward formula
// of some differentiable input reads input i. Training graphs are assumed:
// every floating tensor may require grad.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/saved_tensors.h"

#include <set>

#include "memslim/core/activation_table.h"
#include "memslim/core/norm_table.h"

namespace memslim::saved {

namespace {

// Ops keeping none of their inputs (shape-only or linear backward).
const std::set<std::string> kKeepsNothing = {
    "aten::add",
    "aten::sub",
    "aten::add_", // in place: backward reads neither operand (ResNet's `out += identity`)
    "aten::sub_",
    "aten::rsub",
    "aten::neg",
    "aten::view",
    "aten::reshape",
    "aten::flatten",
    "aten::permute",
    "aten::transpose",
    "aten::t",
    "aten::contiguous",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::expand",
    "aten::slice",
    "aten::select",
    "aten::cat",
    "aten::stack",
    "aten::chunk",
    "aten::split",
    "aten::size",
    "aten::sum",
    "aten::mean",
    "aten::dropout",
    "aten::feature_dropout",
    "aten::alpha_dropout",
    "aten::to",
    "aten::_autocast_to_reduced_precision", // TorchScript's autocast casts: the
    "aten::_autocast_to_full_precision",    // gradient is cast back, nothing kept
    "aten::detach",
    "aten::clone",
    "aten::zeros_like",
    "aten::ones_like",
    "aten::empty_like",
    "aten::dim",
    "aten::len",
    "aten::__getitem__",
    "aten::Int",
    "aten::Float",
    "aten::ScalarImplicit",
    "aten::format",
    "aten::warn",
    "aten::__is__",
    "aten::__isnot__",
    "aten::eq",
    "aten::ne",
    "aten::lt",
    "aten::gt",
    "aten::le",
    "aten::ge",
    "aten::__not__",
    "aten::list",
    "aten::append",
};
// Ops keeping every tensor input.
const std::set<std::string> kKeepsAll = {
    "aten::mul",       "aten::div",          "aten::matmul",      "aten::mm",
    "aten::bmm",       "aten::linear",       "aten::conv1d",      "aten::conv2d",
    "aten::conv3d",    "aten::_convolution", "aten::convolution", "aten::conv_transpose2d",
    "aten::einsum",    "aten::baddbmm",
    "memslim::linear", // a loss head's linear (linear_ops.cpp): input and weight
};
// Ops keeping their first input (and possibly small statistics). Average
// pooling: aten's backward reads the input (avg_pool2d_backward(grad, self)).
// adaptive_avg_pool2d: see adaptive_pool_keeps_input.
const std::set<std::string> kKeepsFirst = {
    "aten::avg_pool2d",    "aten::avg_pool1d", "aten::adaptive_avg_pool1d",
    "aten::batch_norm",    "aten::layer_norm", "aten::group_norm",
    "aten::instance_norm", "aten::max_pool2d", "aten::max_pool1d",
    "aten::rms_norm",      "aten::log",        "aten::abs",
    "aten::sin",           "aten::cos",        "aten::erf",
    "aten::clamp",         "aten::hardtanh",   "aten::relu6",
    "aten::lgamma",
};
// Ops keeping their output (sqrt, rsqrt, reciprocal: measured with
// saved_tensors_hooks; they were listed as keeping their input).
const std::set<std::string> kKeepsOutput = {
    "aten::softmax", "aten::log_softmax", "aten::exp",
    "aten::sqrt",    "aten::rsqrt",       "aten::reciprocal",
};

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// adaptive_avg_pool2d to 1x1 is a mean, which keeps nothing in eager autograd.
// TorchScript's symbolic gradient keeps the input whenever the executor puts
// the pool in a DifferentiableGraph, which needs a neighbour its autodiff
// differentiates. Its producer is the activation being priced (rewritten to a
// memslim op, which autodiff does not differentiate), so a differentiable
// consumer decides: timm's head pool -> dropout(p=0) kept the input
// (resnetv2_50x1_bit: the relu's bits added 2,048 B); torchvision's pool ->
// flatten did not (measured: the relu rewrite frees its full output).
// Any other output size keeps the input.
bool adaptive_pool_keeps_input(const GraphView& g, NodeRef pool) {
  bool to_one = false;
  if (g.num_inputs(pool) > 1) {
    const auto size = g.constant(g.input(pool, 1));
    if (size && size->isIntList()) {
      const auto v = size->toIntVector();
      to_one = !v.empty();
      for (int64_t d : v) to_one = to_one && d == 1;
    }
  }
  if (!to_one) return true;
  if (g.autograd() == GraphView::Autograd::Eager) return false;
  for (const Use& use : g.uses(g.output(pool, 0))) {
    const c10::FunctionSchema* s = g.schema(use.user);
    if (g.owner(use.user) == g.owner(pool) && g.differentiable(use.user) && !(s && s->is_mutable()))
      return true;
  }
  return false;
}

// A functional dropout whose constant arguments make it return its input.
bool returns_input(const GraphView& g, NodeRef d) {
  return is_dropout_kind(g.kind(d), /*inplace=*/false) && dropout_is_identity(g, d);
}

// memslim::<norm>_add, a residual join (norm_ops.cpp): keeps its output and
// its residual (argument 0).
bool is_join(const std::string& name) {
  const size_t n = name.size();
  return starts_with(name, "memslim::") && n > 4 && name.compare(n - 4, 4, "_add") == 0 &&
         norm_info(c10::Symbol::fromQualString(name.substr(0, n - 4)));
}

std::optional<ActivationInfo> activation_of(const std::string& kind) {
  return activation_info(c10::Symbol::fromQualString(kind));
}

} // namespace

bool keeps_input(const GraphView& g, NodeRef user, size_t index) {
  if (!g.is_tensor(g.input(user, index))) return false;
  const std::string name = g.kind(user);
  if (auto info = activation_of(name)) {
    const bool aten = starts_with(name, "aten::");
    const Keeps k = aten ? info->aten_keeps : info->memslim_keeps;
    return index == 0 && k == Keeps::Input;
  }
  if (name == "prim::ListConstruct") {
    // The input list of a recompute region: the region op keeps every element.
    // The input list of aten::cat: TorchScript's optimising executor (where an
    // optimized module runs) differentiates cat with a symbolic script that
    // keeps its input tensors (measured: cat([a, b]) -> mul keeps a and b
    // scripted, not in eager; stack does not). Without this, mask-only ReLU
    // rewrites in front of googlenet/inception's cat added their bits.
    for (size_t o = 0; o < g.num_outputs(user); ++o)
      for (const Use& use : g.uses(g.output(user, o))) {
        const std::string k = g.kind(use.user);
        if (k == "memslim::recompute_region" ||
            (k == "aten::cat" && g.autograd() == GraphView::Autograd::TorchScript))
          return true;
      }
    return false;
  }
  if (starts_with(name, "prim::")) return false; // Constant, GetAttr, Return...
  if (kKeepsNothing.count(name)) return false;
  if (name == "aten::adaptive_avg_pool2d") return index == 0 && adaptive_pool_keeps_input(g, user);
  // mul keeps an operand for the other's gradient, div its dividend for the
  // divisor's: a Python-scalar other operand needs neither (`h * 0.5`).
  if (name == "aten::mul" && index < 2 && g.num_inputs(user) >= 2)
    return g.is_tensor(g.input(user, 1 - index));
  if (name == "aten::div" && index == 0 && g.num_inputs(user) >= 2)
    return g.is_tensor(g.input(user, 1));
  if (kKeepsAll.count(name)) return true;
  if (kKeepsFirst.count(name)) return index == 0;
  if (kKeepsOutput.count(name)) return false;
  if (name == "aten::where") return index == 0;     // the condition
  if (name == "aten::pow") return true;             // base and exponent (when tensors)
  if (name == "aten::embedding") return index == 1; // the indices
  if (name == "aten::addmm") return index >= 1;     // mat1, mat2
  // memslim::act_<consumer> keeps its input (it recomputes the activation from
  // it) and the weight.
  if (starts_with(name, "memslim::act_")) return index <= 1;
  if (is_join(name)) return index == 0;
  if (starts_with(name, "memslim::")) return false;
  return true; // unknown op: conservatively keeps every tensor input
}

bool keeps_output(const GraphView& g, NodeRef producer) {
  const std::string name = g.kind(producer);
  if (auto info = activation_of(name)) {
    const Keeps k = starts_with(name, "aten::") ? info->aten_keeps : info->memslim_keeps;
    return k == Keeps::Output || k == Keeps::OutputAndBits;
  }
  // memslim's norms keep their output (and per-group statistics).
  if (starts_with(name, "memslim::") && norm_info(c10::Symbol::fromQualString(name))) return true;
  if (is_join(name)) return true;
  // pow with a tensor exponent also keeps its result (d/d exponent = result * log(base)).
  if (name == "aten::pow" && g.num_inputs(producer) > 1 && g.is_tensor(g.input(producer, 1)))
    return true;
  return kKeepsOutput.count(name) > 0;
}

// Whether `v` is (a view of) module state: a parameter or buffer lives as long
// as the module, so keeping it costs autograd nothing (timm's StdConv2d
// standardises its weight with F.batch_norm: that norm's input is the weight).
// TorchScript: a prim::GetAttr (FX: a get_attr node); FX: also export's
// parameter and buffer placeholders (GraphView::module_state).
bool is_module_state(const GraphView& g, ValueRef v) {
  for (int guard = 0; guard < 1000; ++guard) {
    if (g.module_state(v)) return true;
    const NodeRef p = g.producer(v);
    if (!p) return false;
    if (g.kind(p) == "prim::GetAttr") return g.is_tensor(v);
    if (g.num_inputs(p) == 0 || !is_view_of_input(g, p, 0)) return false;
    v = g.input(p, 0);
  }
  return false;
}

bool keeps_copy_of_input(const GraphView& g, NodeRef user, size_t index) {
  const std::string k = g.kind(user);
  if (index != 0 || (k != "aten::linear" && k != "aten::matmul")) return false;
  if (k == "aten::matmul" && (g.num_inputs(user) < 2 || g.rank(g.input(user, 1)).value_or(3) > 2))
    return false;
  const ValueRef x = g.input(user, 0);
  return g.rank(x).value_or(0) >= 3 && g.contiguous(x) == false;
}

bool kept_by_other(const GraphView& g, ValueRef v, const NodeSet& except, std::string* who,
                   bool surely) {
  if (is_module_state(g, v)) {
    if (who) *who = "the module (a parameter or buffer)";
    return true;
  }
  const NodeRef p = g.producer(v);
  if (p && !except.count(p) && !g.is_input(v) && keeps_output(g, p)) {
    if (who) *who = g.kind(p);
    return true;
  }
  // Where `v` is made: a reader in another block (an If's branch, a loop's
  // body) may not run.
  const NodeRef where = p ? g.owner(p) : NodeRef{};
  for (const Use& use : g.uses(v)) {
    const NodeRef u = use.user;
    if (except.count(u)) continue;
    if (surely && g.owner(u) != where) continue;
    if (keeps_input(g, u, use.index) && !keeps_cast_copy_of_input(g, u, use.index) &&
        !(surely && keeps_copy_of_input(g, u, use.index))) {
      if (who) *who = g.kind(u);
      return true;
    }
    // Packed into a tuple (a traced module passes each submodule's results
    // through TupleConstruct -> TupleUnpack): whoever keeps the unpacked
    // element keeps this tensor. A tuple read any other way: conservatively
    // kept, unless it is returned.
    if (g.kind(u) == "prim::TupleConstruct" && g.num_outputs(u) == 1) {
      for (const Use& tu : g.uses(g.output(u, 0))) {
        if (surely && g.owner(tu.user) != where) continue;
        const std::string tk = g.kind(tu.user);
        if (tk == "prim::TupleUnpack" && use.index < g.num_outputs(tu.user)) {
          if (kept_by_other(g, g.output(tu.user, use.index), except, who, surely)) return true;
          continue;
        }
        if (tk == "prim::TupleIndex" && g.num_inputs(tu.user) > 1 && g.num_outputs(tu.user) == 1) {
          const auto i = g.constant(g.input(tu.user, 1));
          if (i && i->isInt()) {
            if (i->toInt() == int64_t(use.index) &&
                kept_by_other(g, g.output(tu.user, 0), except, who, surely))
              return true;
            continue;
          }
        }
        if (tk == "prim::Return" && !g.owner(tu.user)) continue;
        if (who) *who = tk;
        return true;
      }
      continue;
    }
    // Returned from an If branch: whoever keeps the If's output keeps this
    // tensor (timm's SE gate: `x.sigmoid_() if inplace else x.sigmoid()`).
    // From a loop body: conservatively kept.
    if (g.kind(u) == "prim::Return" && g.owner(u)) {
      const NodeRef owner = g.owner(u);
      if (g.kind(owner) != "prim::If") {
        if (who) *who = g.kind(owner);
        return true;
      }
      if (use.index < g.num_outputs(owner) &&
          kept_by_other(g, g.output(owner, use.index), except, who, surely))
        return true;
      continue;
    }
    // A view shares the storage: keeping the view keeps these bytes (GPT-2's
    // Conv1D: addmm keeps `x.view(-1, n)` of the GELU's output). So does a
    // dropout that returns its input in eager autograd (p == 0 or not training:
    // ATen's _dropout_impl returns `input` itself; ViT's MLP dropout at p = 0).
    // Not under TorchScript's executor, whose DifferentiableGraphs run dropout
    // as native_dropout, a new tensor.
    if (is_view_of_input(g, u, use.index) ||
        (use.index == 0 && g.autograd() == GraphView::Autograd::Eager && returns_input(g, u))) {
      for (size_t o = 0; o < g.num_outputs(u); ++o) {
        const ValueRef out = g.output(u, o);
        if (g.is_tensor(out) && kept_by_other(g, out, except, who, surely)) return true;
      }
    }
  }
  return false;
}

bool keeps_cast_copy_of_input(const GraphView& g, NodeRef user, size_t index) {
  const std::string k = g.kind(user);
  // autocast's lower-precision ops among those keeping their inputs (not mul / div).
  if (!kKeepsAll.count(k) && k != "aten::addmm") return false;
  if (k == "aten::mul" || k == "aten::div") return false;
  if (!g.num_outputs(user) || index >= g.num_inputs(user)) return false;
  const ValueRef in = g.input(user, index);
  if (!g.is_tensor(in)) return false;
  const auto from = g.dtype(in);
  const auto to = g.dtype(g.output(user, 0));
  return from && to && *from != *to && (*to == at::kBFloat16 || *to == at::kHalf) &&
         c10::isFloatingType(*from);
}

bool casts_to_another_dtype(const GraphView& g, NodeRef n) {
  const std::string k = g.kind(n);
  if (k != "aten::_autocast_to_reduced_precision" && k != "aten::_autocast_to_full_precision" &&
      k != "aten::to")
    return false;
  if (!g.num_inputs(n) || !g.num_outputs(n)) return false;
  const auto from = g.dtype(g.input(n, 0));
  const auto to = g.dtype(g.output(n, 0));
  return from && to && *from != *to;
}

bool is_view_of_input(const GraphView& g, NodeRef n, size_t index) {
  return may_alias_input(g, n, index) && !(index == 0 && casts_to_another_dtype(g, n));
}

bool may_alias_input(const GraphView& g, NodeRef n, size_t index) {
  const c10::FunctionSchema* s = g.schema(n);
  if (!s || s->returns().empty() || index >= s->arguments().size()) return false;
  const c10::AliasInfo* out = s->returns()[0].alias_info();
  const c10::AliasInfo* in = s->arguments()[index].alias_info();
  return out && in && !out->isWrite() && !in->isWrite() && out->beforeSets() == in->beforeSets();
}

bool returns_written_first(const c10::FunctionSchema* s) {
  return s && !s->returns().empty() && !s->arguments().empty() && s->returns()[0].alias_info() &&
         s->returns()[0].alias_info()->isWrite() && s->arguments()[0].alias_info() &&
         s->arguments()[0].alias_info()->isWrite();
}

bool is_dropout_kind(const std::string& kind, bool inplace) {
  static const char* names[] = {"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
                                "aten::feature_alpha_dropout"};
  const size_t base = kind.size() - (inplace ? 1 : 0); // the name without its `_`
  if (inplace && (kind.empty() || kind.back() != '_')) return false;
  for (const char* n : names)
    if (kind.compare(0, base, n) == 0 && std::char_traits<char>::length(n) == base) return true;
  return false;
}

bool dropout_is_identity(const GraphView& g, NodeRef d) {
  if (g.num_inputs(d) < 3) return false;
  const auto p = g.constant(g.input(d, 1));
  const auto train = g.constant(g.input(d, 2));
  return (p && p->isDouble() && p->toDouble() == 0) ||
         (train && train->isBool() && !train->toBool());
}

} // namespace memslim::saved

namespace memslim {

bool switches_grad_mode(const std::string& kind) {
  return kind == "prim::Enter" || kind == "prim::Exit" || kind == "python::_set_grad_enabled" ||
         kind == "python::_enter_autocast" || kind == "python::_exit_autocast";
}

std::optional<std::string> write_observable(const GraphView& g, ValueRef w) {
  if (g.uses(w).size() != 1) return std::string("its input has another use");
  const NodeRef p = g.producer(w);
  if (!p || g.kind(p) == "prim::Param") return std::string("its input is a graph input");
  if (saved::is_dropout_kind(g.kind(p), /*inplace=*/false))
    return "its input may be another tensor (" + g.kind(p) +
           " returns its input when not training)";
  if (g.kind(p).rfind("prim::", 0) == 0) return "its input comes from " + g.kind(p);
  const c10::FunctionSchema* schema = g.schema(p);
  if (!schema) return "its input comes from " + g.kind(p) + " (no schema)";
  // The result of an in-place op (ResNet's `out += identity` on a norm's fresh
  // output) is its first argument's storage: unobservable where that argument
  // has no other use and is itself unobservable, down the chain.
  if (saved::returns_written_first(schema) && g.num_inputs(p) > 0 && g.is_tensor(g.input(p, 0)))
    return write_observable(g, g.input(p, 0));
  for (const auto& r : schema->returns())
    if (r.alias_info()) return "its input may alias another tensor (" + g.kind(p) + ")";
  return std::nullopt;
}

} // namespace memslim
