//===- optimize.cpp - memslim::optimize over a module's methods ------------===//
#include "memslim/jit/optimize.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/shape_analysis.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/library.h>

#include <cmath>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/recompute_blocks.h"
#include "memslim/jit/saved_tensor_analysis.h"

namespace memslim {

using torch::jit::Graph;
using torch::jit::Module;
using torch::jit::Node;
using torch::jit::Value;

namespace {
// The recording run's sink: memslim::_record_type writes each recorded
// tensor's complete type into slot `id`. Thread-local: one recording per thread.
thread_local std::vector<c10::TypePtr>* g_record_sink = nullptr;
} // namespace

namespace {
// Nodes without outputs whose only effect is outside the program (printing,
// warnings, files, statistics): left out of the recording copy.
bool inert_in_recording(const Node* n) {
  static const c10::Symbol kinds[] = {c10::prim::Print, c10::aten::warn,
                                      c10::Symbol::fromQualString("aten::save"),
                                      c10::prim::AddStatValue, c10::prim::TimePoint};
  if (!n->outputs().empty()) return false;
  for (c10::Symbol k : kinds)
    if (n->kind() == k) return true;
  return false;
}

// The global generators' states, put back on destruction: the recording run
// draws random numbers (dropout) that the user's next call would otherwise miss.
class RngStateGuard {
 public:
  explicit RngStateGuard(const std::vector<c10::IValue>& inputs) {
    save(at::detail::getDefaultCPUGenerator());
    for (const auto& v : inputs)
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cuda())
        save(at::globalContext().defaultGenerator(v.toTensor().device()));
  }
  ~RngStateGuard() {
    for (auto& [gen, state] : saved_) {
      try {
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(state);
      } catch (...) {
      }
    }
  }

 private:
  void save(at::Generator gen) {
    for (const auto& s : saved_)
      if (s.first == gen) return;
    std::lock_guard<std::mutex> lock(gen.mutex());
    saved_.emplace_back(gen, gen.get_state());
  }
  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};
} // namespace

void record_shapes(const std::shared_ptr<Graph>& graph, const std::vector<c10::IValue>& inputs) {
  TORCH_CHECK(graph->inputs().size() == inputs.size(), "the graph takes ", graph->inputs().size(),
              " inputs, got ", inputs.size());
  // Recording run: a copy of the graph in which every tensor a node produces
  // (in any block: branches and loop bodies included) is passed to
  // memslim::_record_type right after it is made; the copy is interpreted once
  // without grad. Graph::copy keeps the structure, so a depth-first walk of
  // both graphs pairs the values up. Values in branches that did not run keep
  // their generic type (and their sites are priced "unknown shape").
  std::shared_ptr<Graph> rec = graph->copy();
  std::vector<Value*> recorded;
  std::vector<std::pair<Node*, Value*>> probes; // (node in copy, its output to record)
  std::vector<Node*> inert;                     // side-effect nodes of the copy
  {
    std::shared_ptr<Graph> g_mut = graph;
    torch::jit::DepthFirstGraphNodeIterator o(g_mut);
    torch::jit::DepthFirstGraphNodeIterator c(rec);
    for (Node *on = o.next(), *cn = c.next(); on && cn; on = o.next(), cn = c.next()) {
      TORCH_INTERNAL_ASSERT(on->kind() == cn->kind(), "graph copy changed node order");
      if (inert_in_recording(cn)) inert.push_back(cn);
      for (size_t i = 0; i < on->outputs().size(); ++i) {
        if (!on->output(i)->type()->cast<c10::TensorType>()) continue;
        recorded.push_back(on->output(i));
        probes.emplace_back(cn, cn->output(i));
      }
    }
  }
  for (Node* n : inert) n->destroy();
  const c10::Symbol record = c10::Symbol::fromQualString("memslim::_record_type");
  for (size_t id = 0; id < probes.size(); ++id) {
    auto [node, value] = probes[id];
    torch::jit::WithInsertPoint guard(node->next());
    rec->insertNode(rec->create(record, {value, rec->insertConstant(int64_t(id))}, 0));
  }
  std::vector<c10::TypePtr> sink(recorded.size());
  torch::jit::Stack stack(inputs.begin(), inputs.end());
  {
    RngStateGuard keep_rng(inputs);
    at::NoGradGuard no_grad;
    g_record_sink = &sink;
    try {
      torch::jit::Code code(rec, "memslim_shape_recording");
      torch::jit::InterpreterState(code).run(stack);
    } catch (...) {
      g_record_sink = nullptr;
      throw;
    }
    g_record_sink = nullptr;
  }
  for (size_t i = 0; i < recorded.size(); ++i)
    if (sink[i]) recorded[i]->setType(sink[i]);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].isTensor() && inputs[i].toTensor().defined())
      graph->inputs()[i]->setType(c10::TensorType::create(inputs[i].toTensor()));
}

void propagate_shapes(const std::shared_ptr<Graph>& graph, const Module& module,
                      const std::vector<c10::IValue>& example_inputs,
                      const std::unordered_map<std::string, c10::IValue>& kwargs) {
  auto forward = module.find_method("forward");
  TORCH_CHECK(forward, "memslim.optimize: the module has no forward method");
  const c10::FunctionSchema& schema = forward->function().getSchema();
  const auto& args = schema.arguments();
  TORCH_CHECK(args.size() == graph->inputs().size(),
              "memslim.optimize: forward's schema and graph differ");
  const size_t want = args.size() - 1;
  TORCH_CHECK(example_inputs.size() <= want, "memslim.optimize: forward takes ", want,
              " inputs, got ", example_inputs.size(), " example inputs");
  std::vector<c10::IValue> inputs{module._ivalue()};
  inputs.insert(inputs.end(), example_inputs.begin(), example_inputs.end());
  std::unordered_map<std::string, c10::IValue> kw = kwargs;
  for (const auto& [name, value] : kwargs) {
    bool known = false;
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i].name() != name) continue;
      known = true;
      TORCH_CHECK(i > example_inputs.size(), "memslim.optimize: forward's argument '", name,
                  "' is given both by position and by keyword");
    }
    TORCH_CHECK(known, "memslim.optimize: forward has no argument '", name, "'");
  }
  // Arguments not given: their defaults; trailing Optional ones without a
  // default (masks and the like): None; anything else is missing.
  for (size_t i = inputs.size(); i < args.size(); ++i) {
    const auto& a = args[i];
    if (kw.count(a.name()) || a.default_value()) continue;
    TORCH_CHECK(a.type()->kind() == c10::TypeKind::OptionalType, "memslim.optimize: forward takes ",
                want, " inputs, got ", example_inputs.size(), " example inputs: no value for '",
                a.name(), "' (", a.type()->repr_str(), ", no default)");
    kw[a.name()] = c10::IValue();
  }
  schema.checkAndNormalizeInputs(inputs, kw);
  ModuleStateGuard keep_state(module);
  record_shapes(graph, inputs);
}

void check_policy(const CostPolicy& p) {
  const std::string why = policy_error(p); // passes/core/policy.cpp's table
  TORCH_CHECK(why.empty(), why);
}

ModuleStateGuard::ModuleStateGuard(const Module& module) {
  std::vector<c10::intrusive_ptr<c10::ivalue::Object>> todo{module._ivalue()};
  std::unordered_set<const c10::ivalue::Object*> seen;
  at::NoGradGuard no_grad;
  while (!todo.empty()) {
    auto obj = todo.back();
    todo.pop_back();
    if (!seen.insert(obj.get()).second) continue;
    auto cls = obj->type();
    for (size_t i = 0; i < obj->slots().size(); ++i) {
      const c10::IValue& v = obj->getSlot(i);
      Slot s{obj, i, v, {}};
      if (v.isTensor() && v.toTensor().defined() &&
          !(i < cls->numAttributes() && cls->is_parameter(i)))
        s.contents = v.toTensor().detach().clone();
      slots_.push_back(std::move(s));
      if (v.isObject() && v.toObjectRef().type()->is_module()) todo.push_back(v.toObject());
    }
  }
}

void ModuleStateGuard::restore() {
  at::NoGradGuard no_grad;
  for (auto& s : slots_) {
    s.object->setSlot(s.index, s.value);
    if (!s.contents.defined()) continue;
    at::Tensor t = s.value.toTensor().detach();
    if (t.sizes() == s.contents.sizes() && t.scalar_type() == s.contents.scalar_type())
      t.copy_(s.contents);
    else
      t.set_(s.contents.clone());
  }
}

ModuleStateGuard::~ModuleStateGuard() {
  try {
    restore();
  } catch (...) {
  }
}

namespace {

const c10::Symbol kPinAttr = c10::Symbol::attr("memslim_pin");

// Whether the tensor `w` an in-place op writes is linked, through views and
// dropouts that may return their input, to a dropout of that kind: the one
// aliasing torch's DCE cannot see. Elsewhere its DCE decides soundly which
// writes are dead, and memslim keeps what the scripted module keeps (a dead
// write kept alive can make the executor fail: long-fuzz seed 107469, clamp_ on
// softplus's output, which a DifferentiableGraph keeps).
bool reaches_hidden_alias(const Value* w) {
  std::vector<const Value*> work{w};
  std::unordered_set<const Value*> seen{w};
  auto visit = [&](const Value* v) {
    if (seen.insert(v).second) work.push_back(v);
  };
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    const Node* p = v->node();
    if (SavedTensorAnalysis::may_return_input(p)) return true;
    if (SavedTensorAnalysis::is_view_of_input(p, 0)) visit(p->input(0));
    for (const auto& use : v->uses()) {
      if (use.offset != 0) continue;
      if (SavedTensorAnalysis::may_return_input(use.user)) return true;
      if (SavedTensorAnalysis::is_view_of_input(use.user, 0) && use.user->outputs().size() == 1)
        visit(use.user->output());
    }
  }
  return false;
}

// Gives every random op, and every in-place write torch's DCE cannot judge (see
// reaches_hidden_alias), a reader with side effects (a tagged prim::Print), so
// the DCE of constant propagation keeps it: for it,
// `d = dropout(h, p, training); tanh_(d)` writes a fresh d (a fuzzer finding:
// the write to h vanished).
std::vector<Node*> pin_unused_writes(torch::jit::Block* b) {
  std::vector<Node*> pins;
  for (Node* n : b->nodes()) {
    for (torch::jit::Block* inner : n->blocks()) {
      auto more = pin_unused_writes(inner);
      pins.insert(pins.end(), more.begin(), more.end());
    }
    if (n->outputs().empty()) continue;
    // Pinned even where the output has a use: inside F.relu's / F.dropout's
    // `if inplace` the only reader is the If that constant propagation folds
    // away, leaving the write unread (long-fuzz seed 108683: `relu_(v0[:, :8])`
    // after an eval-mode dropout that returned v0 itself was deleted).
    bool write = false;
    for (const Value* w : SavedTensorAnalysis::written_inputs(n))
      write = write || reaches_hidden_alias(w);
    // A random op nobody reads still advances the generator: deleting it
    // changes every later mask (eager draws it; a fuzzer finding, two
    // dropouts of one input with the first unused).
    const bool random = !write && SavedTensorAnalysis::draws_random(n);
    if (!write && !random) continue;
    Node* pin = b->owningGraph()->create(c10::prim::Print, {n->output(0)}, 0);
    pin->s_(kPinAttr, write ? "unused write" : "unused random op");
    pin->insertAfter(n);
    pins.push_back(pin);
  }
  return pins;
}

// Removes the pins (constant propagation may have dropped some with a dead branch).
void unpin_writes(const std::shared_ptr<Graph>& graph) {
  std::vector<Node*> pins;
  std::shared_ptr<Graph> g = graph;
  torch::jit::DepthFirstGraphNodeIterator it(g);
  for (Node* n = it.next(); n; n = it.next())
    if (n->kind() == c10::prim::Print && n->hasAttribute(kPinAttr)) pins.push_back(n);
  for (Node* n : pins) n->destroy();
}

// Whether `n` is prim::Enter of `with torch.no_grad():` (TorchScript's class
// torch.autograd.grad_mode.no_grad).
bool enters_no_grad(const Node* n) {
  if (n->kind() != c10::prim::Enter) return false;
  auto cls = n->input(0)->type()->cast<c10::ClassType>();
  if (!cls || !cls->name()) return false;
  const std::string name = cls->name()->qualifiedName();
  const std::string tail = "torch.autograd.grad_mode.no_grad";
  return name.size() >= tail.size() &&
         name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// The node of block `b` that holds `n` (n itself, or the If / Loop around it);
// nullptr where n is not inside b.
Node* ancestor_in(Node* n, const torch::jit::Block* b) {
  while (n && n->owningBlock() != b) n = n->owningBlock()->owningNode();
  return n;
}

// The input an in-place (or out=) op writes and returns as its output `i`
// (`Tensor(a!)`), or nullptr where output i is no written input.
Value* written_input_returned(Node* n, size_t i) {
  const c10::FunctionSchema* schema = n->maybeSchema();
  if (!schema || i >= schema->returns().size()) return nullptr;
  const c10::AliasInfo* ret = schema->returns()[i].alias_info();
  if (!ret || !ret->isWrite()) return nullptr;
  const auto& args = schema->arguments();
  for (size_t j = 0; j < args.size() && j < n->inputs().size(); ++j) {
    const c10::AliasInfo* a = args[j].alias_info();
    if (a && a->isWrite() && a->beforeSets() == ret->beforeSets()) return n->input(j);
  }
  return nullptr;
}

// Whether the tensor `v` (output `i` of its node) was made in block `b` between
// `enter` and `exit`: an in-place op's output is its written input, made where
// that was (`with torch.no_grad(): y = x.tanh_()` returns x itself, whose
// history eager keeps: fuzz seeds 927093, 232).
bool made_between(Value* v, const torch::jit::Block* b, Node* enter, Node* exit) {
  for (int hops = 0; hops < 64; ++hops) {
    Node* p = v->node();
    if (p->owningBlock() != b || !p->isAfter(enter) || !p->isBefore(exit)) return false;
    Value* w = written_input_returned(p, v->offset());
    if (!w) return true;
    v = w;
  }
  return false;
}

// A tensor made inside `with torch.no_grad():` and read after it becomes
// aten::detach of it there. In eager such a tensor has no history; TorchScript's
// common-subexpression elimination merges `sigmoid(x)` inside the block with
// the same expression outside it (it ignores the grad mode), so the scripted
// module's gradient flows where eager's does not, and once memslim has rewritten
// one of the two copies (x * sigmoid(x) -> silu) the merge lands elsewhere and
// the result matches neither (fuzz seed 941090). The detach makes the program
// mean what eager computes, whatever the executor merges. An in-place op's
// result is its input (made_between); a view made in the block carries no
// history in eager either. Tensors inside lists or tuples that leave the block
// are not reached.
void detach_no_grad_results(torch::jit::Block* b) {
  for (Node* n : b->nodes())
    for (torch::jit::Block* inner : n->blocks()) detach_no_grad_results(inner);
  for (Node* enter : b->nodes()) {
    if (!enters_no_grad(enter)) continue;
    Node* exit = nullptr;
    for (Node* n = enter->next(); n != b->return_node(); n = n->next())
      if (n->kind() == c10::prim::Exit && n->input(0) == enter->input(0)) {
        exit = n;
        break;
      }
    if (!exit) continue;
    Node* insert_after = exit;
    for (Node* n = enter->next(); n != exit; n = n->next()) {
      for (Value* v : n->outputs()) {
        if (!v->type()->isSubtypeOf(*c10::TensorType::get())) continue;
        if (!made_between(v, b, enter, exit)) continue;
        std::vector<torch::jit::Use> later;
        for (const auto& use : v->uses()) {
          Node* a = ancestor_in(use.user, b);
          if (a && (a == b->return_node() || a->isAfter(exit))) later.push_back(use);
        }
        if (later.empty()) continue;
        Node* d = b->owningGraph()->create(c10::aten::detach, {v}, 1);
        d->output()->setType(v->type());
        d->insertAfter(insert_after);
        insert_after = d;
        for (const auto& use : later) use.user->replaceInput(use.offset, d->output());
      }
    }
  }
}

} // namespace

OptimizeResult optimize(const Module& module, const OptimizeOptions& options) {
  // clone(inplace=true): new class types with their own method graphs, the
  // same parameter and buffer tensors (an optimizer over the original model
  // keeps training the optimized one).
  check_policy(options.policy);
  OptimizeResult result{module.clone(/*inplace=*/true), {}};
  std::vector<const PassInfo*> plan;
  try {
    plan = resolve_plan(options.passes, options.pipeline);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "memslim.optimize: ", e.what());
  }
  for (const auto& method : options.methods) {
    auto m = result.module.find_method(method);
    TORCH_CHECK(m, "memslim.optimize: the module has no method '", method, "'");
    std::shared_ptr<Graph> graph = m->graph();
    {
      // The inliner leaves calls alone while the executor's optimisation flag
      // is off (torch._C._set_graph_executor_optimize(False)); memslim needs
      // the flat graph whatever that flag says.
      const bool was = torch::jit::getGraphExecutorOptimize();
      torch::jit::setGraphExecutorOptimize(true);
      torch::jit::Inline(*graph);
      torch::jit::setGraphExecutorOptimize(was);
    }
    // F.silu / F.gelu and friends script to `if inplace: op_(x) else: op(x)`;
    // folding the constant flag leaves the plain op at top level.
    // Its dead-code elimination trusts AliasDb, which cannot see that dropout
    // returns its input when not training: in-place writes whose result is
    // unused are pinned for its duration (see pin_unused_writes).
    pin_unused_writes(graph->block());
    torch::jit::ConstantPropagation(graph);
    unpin_writes(graph);
    detach_no_grad_results(graph->block());
    if (method == "forward" && (!options.example_inputs.empty() || !options.example_kwargs.empty()))
      propagate_shapes(graph, result.module, options.example_inputs, options.example_kwargs);
    PassContext ctx;
    ctx.policy = options.policy;
    // MEMSLIM_STRICT=1 (the test suites): a failing pass is an error, not a rollback.
    const char* strict_env = std::getenv("MEMSLIM_STRICT");
    ctx.strict = options.strict || (strict_env && std::string(strict_env) == "1");
    if (options.policy.memory_budget > 0 && method == "forward")
      run_with_memory_budget(plan, graph, ctx);
    else
      for (const PassInfo* p : plan) run_pass(*p, graph, ctx);
    // Back to generic types: the executor profiles its own.
    torch::jit::EraseShapeInformation(graph);
    for (const Decision& d : ctx.remarks.decisions()) result.decisions.push_back(d);
  }
  return result;
}

} // namespace memslim

// The recording run's probe (not a user op; see record_shapes).
TORCH_LIBRARY_FRAGMENT(memslim, m) {
  // `Any`: values typed Tensor can be Uninitialized at run time (the paths
  // TorchScript builds for early returns); those are not recorded.
  m.def("_record_type(Any t, int id) -> ()", [](const c10::IValue& t, int64_t id) {
    if (t.isTensor() && memslim::g_record_sink && id >= 0 &&
        size_t(id) < memslim::g_record_sink->size())
      (*memslim::g_record_sink)[size_t(id)] = c10::TensorType::create(t.toTensor());
  });
}
