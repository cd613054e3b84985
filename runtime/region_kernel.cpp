//===- region_kernel.cpp - a recompute region as one fused CPU loop --------===//
//
// What: region_kernel.h. Lowering walks the region's graph once per input
// kinds: a node with a full-size operand becomes an instruction of
// kernels::region's program (aten's type rules checked: fp32 arithmetic, bool
// comparisons as 0 / 1, Python numbers as fp32 scalars, pow's Scalar overload
// with its special exponents, add / sub only with alpha 1); a node on 0-dim
// tensors and constants only goes to the prelude graph, which aten runs, and
// whose values reach the loop as broadcast scalars. Backward re-runs the
// prelude under autograd on detached leaves and hands it the loop's summed
// scalar gradients.
// Why: recompute_region.cpp's interpreter writes every intermediate of the
// region to memory and reads it back, and its backward re-runs the region
// under autograd; the loop keeps intermediates in L1-sized chunks.
// Numerics: the loop computes in fp32 with libm / libmvec (aten: Sleef), and
// sums a broadcast scalar's gradient in double (aten: fp32): results differ
// from the interpreter's in the last bits, NaN / inf / signed zeros as aten's.
//
//===----------------------------------------------------------------------===//
#include "memslim/region_kernel.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "memslim/kernels/region_vm.h"
#include "memslim/plain_cpu.h"

namespace memslim {

namespace rk = kernels::region;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

class FusedRegion {
 public:
  rk::Program prog;
  std::vector<size_t> full_inputs; // region input of full register k
  struct Scalar {
    int prelude_out = -1; // index into the prelude's outputs, or -1: a constant
    float value = 0;
  };
  std::vector<Scalar> scalars;
  std::shared_ptr<Graph> prelude;
  std::unique_ptr<torch::jit::Code> prelude_code; // null: no prelude outputs
};

bool fused_regions_enabled() {
  const char* v = std::getenv("MEMSLIM_REGION_KERNEL");
  return !(v && std::strcmp(v, "0") == 0);
}

std::optional<std::vector<bool>> fused_input_kinds(at::TensorList inputs) {
  std::vector<bool> full(inputs.size(), false);
  const at::Tensor* shape = nullptr;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined() || !plain_cpu(t)) return std::nullopt;
    if (t.dim() == 0) {
      if (t.is_complex()) return std::nullopt;
      continue;
    }
    if (t.scalar_type() != at::kFloat || !t.is_contiguous() || t.numel() == 0) return std::nullopt;
    if (shape && shape->sizes() != t.sizes()) return std::nullopt; // broadcasting
    shape = &t;
    full[i] = true;
  }
  if (!shape) return std::nullopt; // no full-size input: nothing to loop over
  return full;
}

namespace {

// What a graph value is to the lowering.
enum class Kind { Full, Bool, Prelude, Const };
struct Slot {
  Kind kind;
  int reg = -1;         // Full / Bool: provisional register
  Value* pre = nullptr; // Prelude: its value in the prelude graph
  c10::IValue constant; // Const
};

struct Lowering {
  Graph& g;
  std::shared_ptr<FusedRegion> r = std::make_shared<FusedRegion>();
  std::unordered_map<const Value*, Slot> env;
  std::unordered_map<const Value*, Value*> pre_env; // region value -> prelude value
  std::unordered_map<const Value*, int> scalar_of;  // region value -> its scalar register
  // Provisional registers: full inputs k, scalars kScalar + k, temps kTemp + k.
  static constexpr int kScalar = 1 << 20, kTemp = 1 << 21;
  int temps = 0;
  std::string why;

  explicit Lowering(Graph& graph) : g(graph) {}

  bool fail(const std::string& w) {
    if (why.empty()) why = w;
    return false;
  }

  Value* pre_value(Value* v) {
    auto it = pre_env.find(v);
    if (it != pre_env.end()) return it->second;
    // A constant the prelude reads: a constant of the prelude.
    Value* c = r->prelude->insertConstant(*torch::jit::toIValue(v));
    pre_env[v] = c;
    return c;
  }

  // The provisional register holding operand v (a scalar register for
  // prelude values and numbers), or -1.
  int operand(Value* v) {
    auto it = env.find(v);
    if (it == env.end()) return fail("%" + v->debugName() + " has no loop value"), -1;
    const Slot& s = it->second;
    if (s.kind == Kind::Full || s.kind == Kind::Bool) return s.reg;
    // A scalar register, one per region value however often it is read.
    if (auto f = scalar_of.find(v); f != scalar_of.end()) return kScalar + f->second;
    FusedRegion::Scalar sc;
    if (s.kind == Kind::Prelude) {
      if (!v->type()->cast<c10::TensorType>())
        return fail("%" + v->debugName() + " is not a tensor"), -1;
      sc.prelude_out = static_cast<int>(r->prelude->registerOutput(s.pre));
    } else if (s.constant.isDouble()) {
      sc.value = static_cast<float>(s.constant.toDouble());
    } else if (s.constant.isInt()) {
      sc.value = static_cast<float>(s.constant.toInt());
    } else if (s.constant.isBool()) {
      sc.value = s.constant.toBool() ? 1.f : 0.f;
    } else {
      return fail("a constant operand is not a number"), -1;
    }
    r->scalars.push_back(sc);
    const int k = static_cast<int>(r->scalars.size()) - 1;
    scalar_of[v] = k;
    return kScalar + k;
  }

  Kind kind_of(Value* v) const { return env.at(v).kind; }
  bool is_float_full(Value* v) const { return kind_of(v) == Kind::Full; }
  // A Python float (fp32 in aten's promotion with bools and other floats).
  bool is_double(Value* v) const {
    const Slot& s = env.at(v);
    return s.kind == Kind::Const && s.constant.isDouble();
  }
  // A Python int or float.
  std::optional<double> number(Value* v) const {
    const Slot& s = env.at(v);
    if (s.kind != Kind::Const) return std::nullopt;
    if (s.constant.isDouble()) return s.constant.toDouble();
    if (s.constant.isInt()) return static_cast<double>(s.constant.toInt());
    return std::nullopt;
  }
  bool is_none(Value* v) const {
    const Slot& s = env.at(v);
    return s.kind == Kind::Const && s.constant.isNone();
  }

  bool emit(rk::Op op, Node* n, Value* a, Value* b = nullptr, Value* c = nullptr, double imm = 0,
            Kind result = Kind::Full) {
    rk::Instr in;
    in.op = op;
    in.imm = imm;
    in.a = a ? operand(a) : -1;
    in.b = b ? operand(b) : -1;
    in.c = c ? operand(c) : -1;
    if ((a && in.a < 0) || (b && in.b < 0) || (c && in.c < 0)) return false;
    in.dst = kTemp + temps++;
    r->prog.code.push_back(in);
    Slot s;
    s.kind = result;
    s.reg = in.dst;
    env[n->output()] = s;
    return true;
  }

  bool alpha_is_one(Value* v) const {
    auto x = number(v);
    return x && *x == 1.0;
  }

  bool lower_node(Node* n) {
    const std::string k = n->kind().toQualString();
    const auto in = n->inputs();
    if (n->outputs().size() != 1) return fail(k + " has several outputs");
    auto arith2 = [&](rk::Op op, Value* a, Value* b) {
      if (!is_float_full(a) && !is_float_full(b)) return fail(k + " on no fp32 full-size operand");
      return emit(op, n, a, b);
    };
    auto unary = [&](rk::Op op) {
      if (in.size() != 1 || !is_float_full(in[0])) return fail(k + " not on one fp32 operand");
      return emit(op, n, in[0]);
    };
    auto compare = [&](rk::Op op) {
      if (in.size() != 2) return fail(k + " with " + std::to_string(in.size()) + " operands");
      return emit(op, n, in[0], in[1], nullptr, 0, Kind::Bool);
    };
    if (k == "aten::add" || k == "aten::sub" || k == "aten::rsub") {
      if (in.size() != 3 || !alpha_is_one(in[2])) return fail(k + " with alpha other than 1");
      if (k == "aten::add") return arith2(rk::Op::Add, in[0], in[1]);
      if (k == "aten::sub") return arith2(rk::Op::Sub, in[0], in[1]);
      return arith2(rk::Op::Sub, in[1], in[0]);
    }
    if (k == "aten::mul" && in.size() == 2) return arith2(rk::Op::Mul, in[0], in[1]);
    if (k == "aten::div" && (in.size() == 2 || (in.size() == 3 && is_none(in[2]))))
      return arith2(rk::Op::Div, in[0], in[1]);
    if (k == "aten::pow" && in.size() == 2) {
      // pow.Tensor_Scalar: aten's special exponents; the other overloads: powf.
      if (is_float_full(in[0]) && env.at(in[1]).kind == Kind::Const) {
        auto e = number(in[1]);
        if (!e) return fail("pow with a non-number exponent");
        return emit(rk::Op::PowConst, n, in[0], nullptr, nullptr, *e);
      }
      if (env.at(in[0]).kind == Kind::Const && !number(in[0]))
        return fail("pow of a non-number base");
      return arith2(rk::Op::Pow, in[0], in[1]);
    }
    if (k == "aten::square") {
      if (in.size() != 1 || !is_float_full(in[0])) return fail(k + " not on fp32");
      return emit(rk::Op::PowConst, n, in[0], nullptr, nullptr, 2.0);
    }
    static const std::unordered_map<std::string, rk::Op> unaries = {
        {"aten::neg", rk::Op::Neg},     {"aten::exp", rk::Op::Exp},
        {"aten::log", rk::Op::Log},     {"aten::sigmoid", rk::Op::Sigmoid},
        {"aten::tanh", rk::Op::Tanh},   {"aten::sqrt", rk::Op::Sqrt},
        {"aten::rsqrt", rk::Op::Rsqrt}, {"aten::reciprocal", rk::Op::Reciprocal},
        {"aten::expm1", rk::Op::Expm1}, {"aten::log1p", rk::Op::Log1p},
        {"aten::relu", rk::Op::Relu}};
    if (auto u = unaries.find(k); u != unaries.end()) return unary(u->second);
    static const std::unordered_map<std::string, rk::Op> compares = {
        {"aten::gt", rk::Op::Gt},           {"aten::lt", rk::Op::Lt},
        {"aten::ge", rk::Op::Ge},           {"aten::le", rk::Op::Le},
        {"aten::eq", rk::Op::Eq},           {"aten::ne", rk::Op::Ne},
        {"aten::logical_and", rk::Op::And}, {"aten::logical_or", rk::Op::Or},
        {"aten::logical_xor", rk::Op::Xor}};
    if (auto c = compares.find(k); c != compares.end()) return compare(c->second);
    if (k == "aten::logical_not" && in.size() == 1)
      return emit(rk::Op::Not, n, in[0], nullptr, nullptr, 0, Kind::Bool);
    // Clamps with number bounds (the Scalar overloads: strict gradient masks);
    // tensor bounds split ties and NaNs between self and bound: the interpreter.
    if ((k == "aten::clamp_min" || k == "aten::clamp_max") && in.size() == 2) {
      if (!is_float_full(in[0])) return fail(k + " not on fp32");
      if (!number(in[1])) return fail(k + " with a bound that is not a number");
      return emit(k == "aten::clamp_min" ? rk::Op::ClampMin : rk::Op::ClampMax, n, in[0], in[1]);
    }
    if ((k == "aten::clamp" || k == "aten::clip") && in.size() == 3) {
      if (!is_float_full(in[0])) return fail(k + " not on fp32");
      Value* x = in[0];
      if (is_none(in[1]) && is_none(in[2])) return fail(k + " without bounds");
      for (Value* bound : {in[1], in[2]})
        if (!is_none(bound) && !number(bound))
          return fail(k + " with a bound that is not a number");
      if (!is_none(in[1])) {
        if (is_none(in[2])) return emit(rk::Op::ClampMin, n, x, in[1]);
        if (!emit(rk::Op::ClampMin, n, x, in[1])) return false;
        x = n->output(); // the ClampMin's result, rebound below
      }
      return emit(rk::Op::ClampMax, n, x, in[2]);
    }
    if (k == "aten::where" && in.size() == 3) {
      Value *a = in[1], *b = in[2];
      const Kind ka = kind_of(a), kb = kind_of(b);
      Kind result;
      if (ka == Kind::Full || kb == Kind::Full)
        result = Kind::Full;
      else if (ka == Kind::Bool && kb == Kind::Bool)
        result = Kind::Bool;
      else if ((ka == Kind::Bool || is_double(a)) && (kb == Kind::Bool || is_double(b)) &&
               (is_double(a) || is_double(b)))
        result = Kind::Full; // a Python float and a bool or float: fp32
      else
        return fail("where whose result type is not fp32 or bool");
      return emit(rk::Op::Where, n, in[0], a, b, 0, result);
    }
    return fail(k + " has no loop form");
  }

  std::shared_ptr<FusedRegion> run(const std::vector<bool>& full) {
    r->prelude = std::make_shared<Graph>();
    const auto ins = g.inputs();
    if (ins.size() != full.size()) return fail("input count"), nullptr;
    for (size_t i = 0; i < ins.size(); ++i) {
      Value* p = r->prelude->addInput();
      p->setType(ins[i]->type());
      pre_env[ins[i]] = p;
      Slot s;
      if (full[i]) {
        s.kind = Kind::Full;
        s.reg = static_cast<int>(r->full_inputs.size());
        r->full_inputs.push_back(i);
      } else {
        s.kind = Kind::Prelude;
        s.pre = p;
      }
      env[ins[i]] = s;
    }
    for (Node* n : g.nodes()) {
      if (n->kind() == c10::prim::Constant) {
        Slot s;
        s.kind = Kind::Const;
        s.constant = *torch::jit::toIValue(n->output());
        env[n->output()] = s;
        continue;
      }
      bool loop = false;
      for (Value* v : n->inputs()) {
        auto it = env.find(v);
        if (it == env.end()) return fail("%" + v->debugName() + " is defined outside"), nullptr;
        loop = loop || it->second.kind == Kind::Full || it->second.kind == Kind::Bool;
      }
      if (!loop) {
        if (n->blocks().size() > 0) return fail("a node with blocks"), nullptr;
        Node* c = r->prelude->createClone(n, [&](Value* v) { return pre_value(v); });
        r->prelude->insertNode(c);
        for (size_t o = 0; o < n->outputs().size(); ++o) {
          Slot s;
          s.kind = Kind::Prelude;
          s.pre = c->output(o);
          env[n->output(o)] = s;
          pre_env[n->output(o)] = c->output(o);
        }
        continue;
      }
      if (!lower_node(n)) return nullptr;
    }
    for (Value* o : g.outputs()) {
      auto it = env.find(o);
      if (it == env.end() || it->second.kind != Kind::Full || it->second.reg < kTemp)
        return fail("an output that is not an fp32 value the loop computes"), nullptr;
      r->prog.outputs.push_back(it->second.reg);
    }
    // Final register numbers: full inputs, scalars, temps.
    const int n_full = static_cast<int>(r->full_inputs.size());
    const int n_scalar = static_cast<int>(r->scalars.size());
    auto fix = [&](int32_t& v) {
      if (v < 0) return;
      if (v >= kTemp)
        v = n_full + n_scalar + (v - kTemp);
      else if (v >= kScalar)
        v = n_full + (v - kScalar);
    };
    for (rk::Instr& in : r->prog.code) {
      fix(in.dst), fix(in.a), fix(in.b), fix(in.c);
    }
    for (int32_t& o : r->prog.outputs) fix(o);
    r->prog.n_full = n_full;
    r->prog.n_scalar = n_scalar;
    r->prog.n_regs = n_full + n_scalar + temps;
    if (r->prelude->outputs().size() > 0) {
      torch::jit::EliminateDeadCode(r->prelude);
      r->prelude_code = std::make_unique<torch::jit::Code>(r->prelude, "memslim_region_prelude");
    }
    return r;
  }
};

// The prelude's values (0-dim tensors), or nullopt when one is not.
std::optional<std::vector<at::Tensor>> run_prelude(const FusedRegion& r, at::TensorList inputs) {
  if (!r.prelude_code) return std::vector<at::Tensor>{};
  torch::jit::Stack stack(inputs.begin(), inputs.end());
  torch::jit::InterpreterState(*r.prelude_code).run(stack);
  std::vector<at::Tensor> outs;
  for (auto& v : stack) {
    if (!v.isTensor()) return std::nullopt;
    at::Tensor t = std::move(v).toTensor();
    if (!t.defined() || t.dim() != 0 || t.is_complex() || !plain_cpu(t)) return std::nullopt;
    outs.push_back(std::move(t));
  }
  return outs;
}

std::vector<float> scalar_values(const FusedRegion& r, const std::vector<at::Tensor>& pre) {
  std::vector<float> v;
  for (const auto& s : r.scalars)
    v.push_back(s.prelude_out < 0 ? s.value
                                  : static_cast<float>(pre[s.prelude_out].item<double>()));
  return v;
}

constexpr int64_t kGrain = 32768;

} // namespace

std::shared_ptr<const FusedRegion> lower_region(Graph& graph, const std::vector<bool>& full,
                                                std::string* why) {
  Lowering l(graph);
  auto r = l.run(full);
  if (!r && why) *why = l.why;
  return r;
}

std::optional<std::vector<at::Tensor>> fused_region_forward(const FusedRegion& r,
                                                            at::TensorList inputs) {
  auto pre = run_prelude(r, inputs);
  if (!pre) return std::nullopt;
  const std::vector<float> scalars = scalar_values(r, *pre);
  const at::Tensor& like = inputs[r.full_inputs[0]];
  std::vector<const float*> in;
  for (size_t i : r.full_inputs) in.push_back(inputs[i].const_data_ptr<float>());
  std::vector<at::Tensor> outs;
  std::vector<float*> out;
  for (size_t k = 0; k < r.prog.outputs.size(); ++k) {
    outs.push_back(at::empty(like.sizes(), like.options()));
    out.push_back(outs.back().data_ptr<float>());
  }
  rk::ForwardCall c;
  c.in = in.data();
  c.scalars = scalars.data();
  c.out = out.data();
  at::parallel_for(0, like.numel(), kGrain,
                   [&](int64_t b, int64_t e) { rk::region_forward_cpu(r.prog, c, b, e); });
  return outs;
}

std::optional<std::vector<at::Tensor>> fused_region_backward(const FusedRegion& r,
                                                             at::TensorList inputs,
                                                             at::TensorList grads,
                                                             const std::vector<bool>& wanted) {
  const at::Tensor& like = inputs[r.full_inputs[0]];
  std::vector<at::Tensor> gout(r.prog.outputs.size());
  for (size_t k = 0; k < gout.size() && k < grads.size(); ++k) {
    if (!grads[k].defined()) continue;
    if (grads[k].scalar_type() != at::kFloat || grads[k].sizes() != like.sizes() ||
        !plain_cpu(grads[k]))
      return std::nullopt;
    gout[k] = grads[k].contiguous();
  }
  // The prelude on leaves: scalar inputs that want a gradient require it.
  std::vector<at::Tensor> leaves;
  std::vector<size_t> scalar_wrt;
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor t = inputs[i].detach();
    if (wanted[i] && inputs[i].dim() == 0) {
      t.requires_grad_(true);
      scalar_wrt.push_back(i);
    }
    leaves.push_back(t);
  }
  std::optional<std::vector<at::Tensor>> pre;
  {
    at::AutoGradMode grad_mode(!scalar_wrt.empty());
    pre = run_prelude(r, leaves);
  }
  if (!pre) return std::nullopt;
  const std::vector<float> scalars = scalar_values(r, *pre);
  const int n_full = r.prog.n_full, n_scalar = r.prog.n_scalar;
  std::vector<uint8_t> wrt(r.prog.n_regs, 0), live(gout.size(), 0);
  for (int k = 0; k < n_full; ++k) wrt[k] = wanted[r.full_inputs[k]];
  for (int k = 0; k < n_scalar; ++k) {
    const auto& s = r.scalars[k];
    wrt[n_full + k] = s.prelude_out >= 0 && (*pre)[s.prelude_out].requires_grad();
  }
  for (size_t k = 0; k < gout.size(); ++k) live[k] = gout[k].defined();
  const std::vector<uint8_t> need = rk::needed_gradients(r.prog, wrt, live);

  std::vector<at::Tensor> result(inputs.size());
  std::vector<const float*> in, go;
  std::vector<float*> gi;
  for (size_t i : r.full_inputs) in.push_back(inputs[i].const_data_ptr<float>());
  for (const auto& g : gout) go.push_back(g.defined() ? g.const_data_ptr<float>() : nullptr);
  for (int k = 0; k < n_full; ++k) {
    float* p = nullptr;
    if (need[k]) {
      result[r.full_inputs[k]] = at::empty(like.sizes(), like.options());
      p = result[r.full_inputs[k]].data_ptr<float>();
    }
    gi.push_back(p);
  }
  const int nt = at::get_num_threads();
  std::vector<double> sums(static_cast<size_t>(nt) * std::max(n_scalar, 1), 0.0);
  rk::BackwardCall c;
  c.in = in.data();
  c.scalars = scalars.data();
  c.grad_out = go.data();
  c.grad_in = gi.data();
  c.need = need.data();
  at::parallel_for(0, like.numel(), kGrain, [&](int64_t b, int64_t e) {
    rk::BackwardCall mine = c;
    mine.scalar_grad = sums.data() + static_cast<size_t>(at::get_thread_num()) * n_scalar;
    rk::region_backward_cpu(r.prog, mine, b, e);
  });
  // The scalars' gradients, through the prelude to the 0-dim inputs.
  std::vector<at::Tensor> outs, out_grads, wrt_leaves;
  for (int k = 0; k < n_scalar; ++k) {
    if (!need[n_full + k]) continue;
    double s = 0;
    for (int t = 0; t < nt; ++t) s += sums[static_cast<size_t>(t) * n_scalar + k];
    const at::Tensor& v = (*pre)[r.scalars[k].prelude_out];
    outs.push_back(v);
    out_grads.push_back(at::scalar_tensor(s, v.options().requires_grad(false)));
  }
  for (size_t i : scalar_wrt) wrt_leaves.push_back(leaves[i]);
  if (!outs.empty() && !wrt_leaves.empty()) {
    auto g = torch::autograd::grad(outs, wrt_leaves, out_grads, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t j = 0; j < scalar_wrt.size(); ++j) result[scalar_wrt[j]] = g[j];
  }
  return result;
}

} // namespace memslim
