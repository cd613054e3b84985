//===- graph_text.cpp - a subgraph as the text a memslim op carries ---------===//
//
// See graph_text.h.
//
//===----------------------------------------------------------------------===//
#include "memslim/jit/graph_text.h"

#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/passes/shape_analysis.h>

#include <unordered_map>

#include "memslim/jit/jit_graph_view.h"

namespace memslim {

namespace {

void clear_scopes(torch::jit::Block* b) {
  for (torch::jit::Node* n : b->nodes()) {
    n->setScope(c10::make_intrusive<torch::jit::Scope>());
    for (torch::jit::Block* sub : n->blocks()) clear_scopes(sub);
  }
}

// The printer writes a node without outputs as `<indent> = prim::If(...)`,
// which parseIR rejects; it reads `<indent>prim::If(...)` (indents count, as
// in Python).
std::string parseable(const std::string& printed) {
  std::string out;
  size_t at = 0;
  while (at < printed.size()) {
    size_t end = printed.find('\n', at);
    if (end == std::string::npos) end = printed.size();
    std::string line = printed.substr(at, end - at);
    const size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && first > 0 && line.compare(first, 2, "= ") == 0)
      line.erase(first - 1, 3); // the indent ends before the space of " = "
    out += line;
    if (end < printed.size()) out += '\n';
    at = end + 1;
  }
  return out;
}

} // namespace

std::optional<std::string> op_graph_text(const std::shared_ptr<torch::jit::Graph>& g,
                                         std::string* error) {
  clear_scopes(g->block());
  torch::jit::EraseShapeInformation(g);
  std::string text = parseable(g->toString(/*print_source_locations=*/false));
  try { // the op parses this text at run time: check now
    auto check = std::make_shared<torch::jit::Graph>();
    torch::jit::parseIR(text, check.get());
  } catch (const std::exception& e) {
    // The parser's message may open with blank lines: its first line with text.
    const std::string msg = e.what();
    std::string line;
    for (size_t at = 0; at < msg.size() && line.find_first_not_of(" \t") == std::string::npos;) {
      const size_t end = std::min(msg.find('\n', at), msg.size());
      line = msg.substr(at, end - at);
      at = end + 1;
    }
    if (error) *error = line;
    return std::nullopt;
  }
  return text;
}

namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// How an external value reaches a function: as itself (Tensor, Tensor?),
// boxed into a 0-dim tensor (bool, int, float) or into a 1-dim int64 tensor
// (int[]: ConvNeXt's permute dims, a module attribute); nullopt: it cannot.
// str (torchvision's StochasticDepth `mode`): a trailing `str` input of the
// function, given to the op as its own str[] argument (recompute_block only).
enum class Pass { Tensor, OptionalTensor, Bool, Int, Float, IntList, Str };
std::optional<Pass> passing(const Value* v) {
  const c10::TypePtr& t = v->type();
  if (t->kind() == c10::TypeKind::StringType) return Pass::Str;
  if (t->cast<c10::TensorType>()) return Pass::Tensor;
  if (auto o = t->cast<c10::OptionalType>())
    if (o->getElementType()->cast<c10::TensorType>()) return Pass::OptionalTensor;
  if (t->kind() == c10::TypeKind::BoolType) return Pass::Bool;
  if (t->kind() == c10::TypeKind::IntType) return Pass::Int;
  if (t->kind() == c10::TypeKind::FloatType) return Pass::Float;
  if (auto l = t->cast<c10::ListType>())
    if (l->getElementType()->kind() == c10::TypeKind::IntType) return Pass::IntList;
  return std::nullopt;
}

} // namespace

bool passes_as_str(const torch::jit::Value* v) { return passing(v) == Pass::Str; }

std::string cut_function_text(const FunctionCut& fn, std::string& text, bool strs) {
  auto sub = std::make_shared<Graph>();
  std::unordered_map<const Value*, Value*> env;
  Value* data = sub->addInput("input");
  data->setType(c10::TensorType::get());
  env[JitGraphView::value(fn.input)] = data;
  std::vector<std::pair<Value*, Pass>> boxed;
  for (ValueRef e : fn.external) {
    Value* v = JitGraphView::value(e);
    const auto how = passing(v);
    if (!how || (*how == Pass::Str && !strs))
      return "it reads %" + v->debugName() + " of type " + v->type()->str() +
             (strs ? " (only tensors, bool, int, float, int[] and str pass into the op)"
                   : " (only tensors, bool, int, float and int[] pass into the op)");
    if (*how == Pass::Str) continue; // after the others
    Value* in = sub->addInput();
    in->setType(*how == Pass::OptionalTensor ? v->type() : c10::TensorType::get());
    if (*how == Pass::Tensor || *how == Pass::OptionalTensor)
      env[v] = in;
    else
      boxed.emplace_back(in, *how);
  }
  for (ValueRef e : fn.external) {
    Value* v = JitGraphView::value(e);
    if (passing(v) != Pass::Str) continue;
    Value* in = sub->addInput();
    in->setType(c10::StringType::get());
    env[v] = in;
  }
  // Unbox the scalars first, in the order their inputs were added.
  {
    size_t k = 0;
    for (ValueRef e : fn.external) {
      Value* v = JitGraphView::value(e);
      const auto how = passing(v);
      if (*how == Pass::Tensor || *how == Pass::OptionalTensor || *how == Pass::Str) continue;
      if (*how == Pass::IntList) { // prim::tolist(t, dim 1, element type int)
        Value* one = sub->insertConstant(int64_t(1));
        Value* as_int = sub->insertConstant(int64_t(0));
        Node* u =
            sub->appendNode(sub->create(c10::prim::tolist, {boxed[k++].first, one, as_int}, 1));
        u->output()->setType(v->type());
        env[v] = u->output();
        continue;
      }
      const char* op = *how == Pass::Bool  ? "aten::Bool"
                       : *how == Pass::Int ? "aten::Int"
                                           : "aten::Float";
      Node* u =
          sub->appendNode(sub->create(c10::Symbol::fromQualString(op), {boxed[k++].first}, 1));
      u->output()->setType(v->type());
      env[v] = u->output();
    }
  }
  std::string missing;
  auto map = [&](Value* v) -> Value* {
    auto it = env.find(v);
    if (it != env.end()) return it->second;
    // Constants, and the placeholders of TorchScript's early returns
    // (prim::Uninitialized, read by an If's not-taken branch): copied in.
    if (v->node()->kind() == c10::prim::Constant || v->node()->kind() == c10::prim::Uninitialized) {
      Node* c =
          sub->appendNode(sub->createClone(v->node(), [](Value*) -> Value* { return nullptr; }));
      env[v] = c->output();
      return c->output();
    }
    if (missing.empty()) missing = "%" + v->debugName();
    Value* stand_in = sub->addInput(); // reported below; the graph is discarded
    stand_in->setType(v->type());
    return stand_in;
  };
  for (NodeRef r : fn.nodes) {
    Node* n = JitGraphView::node(r);
    Node* c = sub->appendNode(sub->createClone(n, map));
    for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = c->output(i);
  }
  if (!missing.empty()) return "internal: " + missing + " is neither an input nor a constant";
  sub->registerOutput(env.at(JitGraphView::value(fn.output)));
  if (fn.output2) sub->registerOutput(env.at(JitGraphView::value(fn.output2)));
  std::string error;
  auto printed = op_graph_text(sub, &error);
  if (!printed) return "its graph text does not parse back (" + error + ")";
  text = std::move(*printed);
  return "";
}

torch::jit::Value* cut_argument(torch::jit::Graph& g, torch::jit::Value* v) {
  const auto how = passing(v);
  TORCH_INTERNAL_ASSERT(*how != Pass::Str, "a str passes in the op's str[] argument");
  if (*how == Pass::Tensor || *how == Pass::OptionalTensor) return v;
  if (*how == Pass::IntList) { // aten::tensor(list, int64, None, False)
    Value* dtype = g.insertConstant(int64_t(c10::ScalarType::Long));
    Value* none = g.insertConstant(c10::IValue());
    Value* no_grad = g.insertConstant(false);
    Node* t = g.insertNode(
        g.create(c10::Symbol::fromQualString("aten::tensor"), {v, dtype, none, no_grad}, 1));
    t->output()->setType(c10::TensorType::get());
    return t->output();
  }
  Value* s = v;
  if (*how == Pass::Bool)
    s = g.insertNode(g.create(c10::Symbol::fromQualString("aten::Int"), {v}, 1))->output();
  if (*how == Pass::Bool) s->setType(c10::IntType::get());
  Node* t = g.insertNode(g.create(c10::prim::NumToTensor, {s}, 1));
  t->output()->setType(c10::TensorType::get());
  return t->output();
}

torch::jit::Value* insert_state_list(torch::jit::Graph& g,
                                     const std::vector<torch::jit::Value*>& state) {
  std::vector<torch::jit::Value*> args;
  for (torch::jit::Value* v : state) args.push_back(cut_argument(g, v));
  return g.insertNode(g.createList(c10::OptionalType::create(c10::TensorType::get()), args))
      ->output();
}

void redirect_outside_uses(torch::jit::Value* old, torch::jit::Value* now,
                           const std::unordered_set<const torch::jit::Node*>& covered) {
  now->setType(old->type());
  now->copyMetadata(old);
  const auto uses = old->uses();
  for (const auto& use : uses) {
    const torch::jit::Node* top = use.user;
    while (top->owningBlock()->owningNode()) top = top->owningBlock()->owningNode();
    if (!covered.count(top)) use.user->replaceInput(use.offset, now);
  }
}

} // namespace memslim
