//===- replay.cpp - functions cut from a model, run again in backward ------===//
//
// See replay.h: parsing, write and randomness facts, running with copies of
// written state, the generator-state replay, and the backward walk's helpers.
//
//===----------------------------------------------------------------------===//
#include "memslim/replay.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/jit/ir/irparser.h>

#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "memslim/plain_cpu.h"

namespace memslim::replay {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

namespace {

// Calls fn on every node of g, nested blocks included; stops when fn returns true.
template <typename F>
bool any_node(Graph& g, F fn) {
  std::vector<torch::jit::Block*> todo{g.block()};
  while (!todo.empty()) {
    torch::jit::Block* b = todo.back();
    todo.pop_back();
    for (Node* n : b->nodes()) {
      for (torch::jit::Block* sub : n->blocks()) todo.push_back(sub);
      if (fn(n)) return true;
    }
  }
  return false;
}

// Inputs of `g` written in place by a node of g (nested blocks included):
// declared writes, and the running stats aten's batch_norm / instance_norm
// schemas leave undeclared.
std::vector<bool> written_inputs(Graph& g) {
  std::unordered_map<const Value*, size_t> input_index;
  for (size_t i = 0; i < g.inputs().size(); ++i) input_index[g.inputs()[i]] = i;
  std::vector<bool> out(g.inputs().size(), false);
  auto mark = [&](const Value* v) {
    // Through views of an input (x.view(...).add_(1) writes x).
    while (!input_index.count(v) && v->node()->maybeSchema() && !v->node()->inputs().empty() &&
           v->node()->inputs()[0]->type()->cast<c10::TensorType>()) {
      const auto& args = v->node()->schema().arguments();
      if (args.empty() || !args[0].alias_info() || args[0].alias_info()->isWrite()) break;
      const auto& rets = v->node()->schema().returns();
      if (rets.empty() || !rets[0].alias_info()) break; // not a view of its first input
      v = v->node()->inputs()[0];
    }
    auto it = input_index.find(v);
    if (it != input_index.end()) out[it->second] = true;
  };
  any_node(g, [&](Node* n) {
    const std::string k = n->kind().toQualString();
    if ((k == "aten::batch_norm" || k == "aten::instance_norm") && n->inputs().size() > 4) {
      mark(n->input(3));
      mark(n->input(4));
    }
    if (const c10::FunctionSchema* s = n->maybeSchema())
      for (size_t i = 0; i < s->arguments().size() && i < n->inputs().size(); ++i) {
        const auto& a = s->arguments()[i].alias_info();
        if (a && a->isWrite()) mark(n->input(i));
      }
    return false;
  });
  return out;
}

bool has_random_op(Graph& g) {
  return any_node(g, [](Node* n) {
    // memslim's fused dropout draws numbers too (Node::isNondeterministic
    // reads aten's list only).
    return n->isNondeterministic() ||
           n->kind().toQualString() == std::string("memslim::activation_dropout");
  });
}

} // namespace

Fn parse_fn(const std::string& text, const char* op, const std::string& which, size_t outputs) {
  Fn f;
  f.graph = std::make_shared<Graph>();
  try {
    torch::jit::parseIR(text, f.graph.get());
  } catch (const std::exception& e) {
    std::string msg = e.what();
    TORCH_CHECK(false, op, ": cannot parse ", which, ": ", msg.substr(0, msg.find('\n')));
  }
  bool tensors = f.graph->outputs().size() == outputs;
  for (const Value* o : f.graph->outputs()) tensors = tensors && o->type()->cast<c10::TensorType>();
  TORCH_CHECK(!f.graph->inputs().empty() && tensors, op, ": ", which,
              " must take its block input first and return ",
              outputs == 1 ? std::string("one Tensor") : std::to_string(outputs) + " Tensors");
  f.written = written_inputs(*f.graph);
  f.random = has_random_op(*f.graph);
  f.code = std::make_unique<torch::jit::Code>(f.graph, "memslim_replay_fn");
  return f;
}

at::Tensor run_fn(const Fn& f, const at::Tensor& data, const std::vector<at::Tensor>& ext,
                  bool replay, const char* op, const std::vector<std::string>& strs) {
  return std::move(run_fn_outputs(f, data, ext, replay, op, strs).back());
}

std::vector<at::Tensor> run_fn_outputs(const Fn& f, const at::Tensor& data,
                                       const std::vector<at::Tensor>& ext, bool replay,
                                       const char* op, const std::vector<std::string>& strs) {
  TORCH_CHECK(ext.size() + strs.size() + 1 == f.graph->inputs().size(), op, ": a function takes ",
              f.graph->inputs().size() - 1, " external inputs, got ", ext.size() + strs.size());
  torch::jit::Stack stack;
  stack.reserve(ext.size() + strs.size() + 1);
  stack.emplace_back(replay && f.written[0] ? data.clone() : data);
  for (size_t i = 0; i < ext.size(); ++i) {
    if (!ext[i].defined())
      stack.emplace_back(); // None (an Optional[Tensor] such as a conv's absent bias)
    else if (replay && f.written[i + 1])
      stack.emplace_back(ext[i].clone());
    else
      stack.emplace_back(ext[i]);
  }
  for (const std::string& s : strs) stack.emplace_back(s);
  torch::jit::InterpreterState(*f.code).run(stack);
  std::vector<at::Tensor> out;
  out.reserve(stack.size());
  for (c10::IValue& v : stack) out.push_back(std::move(v).toTensor());
  return out;
}

at::Tensor rng_state(const Fn& f, c10::Device device) {
  if (!f.random) return at::Tensor();
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

std::vector<at::Tensor> state_vec(const c10::List<std::optional<at::Tensor>>& state) {
  std::vector<at::Tensor> out;
  out.reserve(state.size());
  for (const std::optional<at::Tensor>& t : state) out.push_back(t.value_or(at::Tensor()));
  return out;
}

PresentState split_present(const std::vector<at::Tensor>& state) {
  PresentState p;
  p.size = int64_t(state.size());
  for (size_t i = 0; i < state.size(); ++i)
    if (state[i].defined()) {
      p.present.push_back(state[i]);
      p.where.push_back(int64_t(i));
    }
  return p;
}

std::vector<at::Tensor> join_present(at::TensorList present, const std::vector<int64_t>& where,
                                     int64_t size) {
  std::vector<at::Tensor> state(static_cast<size_t>(size));
  for (size_t i = 0; i < where.size(); ++i) state[size_t(where[i])] = present[i];
  return state;
}

bool needs_autograd(std::initializer_list<at::Tensor> data, const std::vector<at::Tensor>& state) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor& t : data)
    if (t.requires_grad()) return true;
  for (const at::Tensor& t : state)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

RngReplay::RngReplay(const at::Tensor& state, c10::Device device) {
  if (!state.defined()) return;
  gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen->mutex());
  now = gen->get_state();
  gen->set_state(state);
}

RngReplay::~RngReplay() {
  if (!gen) return;
  try {
    std::lock_guard<std::mutex> lock(gen->mutex());
    gen->set_state(now);
  } catch (...) {
  }
}

// Only then may a sum land in it: a gradient the engine handed in or one a
// re-run produced can be shared (the same tensor for both halves under
// (y1 + y2).sum(), a cotangent an add passes through), and an in-place add
// would change the other reader's value.
bool sole_owner(const at::Tensor& t) {
  return t.defined() && t.use_count() == 1 && real_data(t) && t.storage().use_count() == 1 &&
         !t.requires_grad() && !t.is_inference() && t.is_non_overlapping_and_dense();
}

void accumulate(at::Tensor& acc, const at::Tensor& d) {
  if (!acc.defined()) {
    acc = d;
  } else if (sole_owner(acc) && acc.sizes() == d.sizes() && acc.device() == d.device() &&
             at::result_type(acc, d) == acc.scalar_type()) {
    acc.add_(d);
  } else {
    acc = at::add(acc, d);
  }
}

// torch 2.14 holds autograd nodes in intrusive_ptr, torch 2.11 (the GPU machine's) in
// shared_ptr: the pointer type is read from the tensor's grad_fn.
using NodePtr = std::decay_t<decltype(std::declval<const at::Tensor&>().grad_fn())>;

// (I is a parameter so that the branch not taken is never instantiated.)
template <typename P = NodePtr, typename I = torch::autograd::Identity>
P make_identity() {
  if constexpr (std::is_same_v<P, std::shared_ptr<torch::autograd::Node>>)
    return std::make_shared<I>();
  else
    return c10::make_intrusive<I>();
}

// As torch::autograd::grad's run_backward builds its edges: a leaf's through
// its grad accumulator, one the roots never reach gets an undefined gradient.
std::vector<at::Tensor> grad_from_edges(const torch::autograd::edge_list& roots,
                                        const std::vector<at::Tensor>& cots,
                                        const std::vector<at::Tensor>& wrt) {
  torch::autograd::edge_list outputs;
  for (const at::Tensor& t : wrt) {
    TORCH_INTERNAL_ASSERT(t.requires_grad());
    NodePtr fn = t.grad_fn();
    if (!fn) fn = torch::autograd::impl::try_get_grad_accumulator(t);
    if (fn)
      outputs.emplace_back(fn, uint32_t(t.output_nr()));
    else
      outputs.emplace_back(make_identity(), 0);
  }
  return torch::autograd::Engine::get_default_engine().execute(roots, cots, /*keep_graph=*/false,
                                                               /*create_graph=*/false,
                                                               /*accumulate_grad=*/false, outputs);
}

} // namespace memslim::replay
