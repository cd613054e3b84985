//===- validate_graph.cpp - reject graphs that no pass can analyse ----------===//
//
// What: walks every block; an op node must match a registered schema for its
// argument types (Node::maybeOperator) with as many outputs as the schema
// returns; a prim without a schema must be one AliasDb special-cases, with the
// shape the interpreter assumes (If: bool, two blocks; Loop: trip count, cond,
// carried values; Constant: a value of its type; tuples of the right arity;
// subgraph nodes with their Subgraph). Then Graph::lint. Why: see the header;
// every finding is one line with the op and its position in the IR text.
//
//===----------------------------------------------------------------------===//
#include "memslim/jit/validate_graph.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <sstream>

namespace memslim {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;
namespace prim = c10::prim;

namespace {

std::string position(const Node* n) {
  const auto& r = n->sourceRange();
  if (r.source() && r.start() < r.source()->size()) {
    const size_t line = r.source()->lineno_for_offset(r.start());
    const size_t col = r.start() - r.source()->offset_for_line(line);
    return "line " + std::to_string(line + 1) + ", column " + std::to_string(col + 1);
  }
  std::ostringstream ss;
  ss << *n;
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  const auto first = s.find_first_not_of(' ');
  return "'" + (first == std::string::npos ? s : s.substr(first)) + "'";
}

std::string types_of(at::ArrayRef<const Value*> vs) {
  std::string out;
  for (const Value* v : vs) out += (out.empty() ? "" : ", ") + v->type()->repr_str();
  return "(" + out + ")";
}

bool is(const Value* v, const c10::TypePtr& t) { return v->type()->isSubtypeOf(*t); }

bool one_of(c10::Symbol k, std::initializer_list<c10::Symbol> kinds) {
  for (c10::Symbol s : kinds)
    if (s == k) return true;
  return false;
}

// Nodes that carry their body as a Subgraph attribute (parseIR cannot read one).
bool needs_subgraph(c10::Symbol k) {
  return one_of(k, {prim::FusionGroup, prim::CudaFusionGroup, prim::oneDNNFusionGroup,
                    prim::DifferentiableGraph, prim::TensorExprGroup, prim::TensorExprDynamicGroup,
                    prim::StaticSubgraph, prim::FunctionalGraph, prim::MKLDNNGroup,
                    prim::FallbackGraph, prim::fork, prim::awaitable});
}

// Nodes only the graph executor and its optimisations make (some with an
// operator registered, which reads attributes or a profiling callback the node
// from text does not have: prim::profile without inputs crashed the process).
bool executor_internal(c10::Symbol k) {
  static const std::vector<c10::Symbol> kinds = [] {
    std::vector<c10::Symbol> out;
    for (const char* name : {"prim::profile",
                             "prim::profile_ivalue",
                             "prim::TypeCheck",
                             "prim::RequiresGradCheck",
                             "prim::BailOut",
                             "prim::BailoutTemplate",
                             "prim::Guard",
                             "prim::FusionGroup",
                             "prim::CudaFusionGroup",
                             "prim::CudaFusionGuard",
                             "prim::oneDNNFusionGroup",
                             "prim::oneDNNFusionGuard",
                             "prim::DifferentiableGraph",
                             "prim::TensorExprGroup",
                             "prim::TensorExprDynamicGroup",
                             "prim::TensorExprDynamicGuard",
                             "prim::StaticSubgraph",
                             "prim::FunctionalGraph",
                             "prim::MKLDNNGroup",
                             "prim::FallbackGraph",
                             "prim::AutogradZero",
                             "prim::AutogradAdd",
                             "prim::AutogradAnyNonZero",
                             "prim::AutogradAllNonZero",
                             "prim::AutogradAllZero",
                             "prim::FusedConcat",
                             "prim::ConstantChunk",
                             "prim::BroadcastingChunk",
                             "prim::ChunkSizes",
                             "prim::BroadcastSizes",
                             "prim::ReductionSizes",
                             "prim::MMTreeReduce",
                             "prim::MMBatchSide",
                             "prim::Load",
                             "prim::Store",
                             "prim::Drop",
                             "prim::PythonOp",
                             "prim::IgnoredPythonOp",
                             "prim::GradOf",
                             "prim::ConstantMKLDNNTensor",
                             "prim::BroadcastMKLDNNTensors",
                             "prim::StaticRuntimeCopyOuts",
                             "prim::Param",
                             "prim::Return",
                             "prim::Closure",
                             "prim::FunctionalGraph",
                             "prim::EmptyListLiteral",
                             "prim::Guard"})
      out.push_back(c10::Symbol::fromQualString(name));
    return out;
  }();
  for (c10::Symbol s : kinds)
    if (s == k) return true;
  return false;
}

// Schema-less prims that module graphs hold and whose shape check_prim knows.
bool checked_prim(c10::Symbol k) {
  return one_of(k, {prim::If,
                    prim::Loop,
                    prim::Constant,
                    prim::TupleConstruct,
                    prim::TupleUnpack,
                    prim::TupleIndex,
                    prim::ListConstruct,
                    prim::ListUnpack,
                    prim::DictConstruct,
                    prim::Uninitialized,
                    prim::unchecked_cast,
                    prim::GetAttr,
                    prim::SetAttr,
                    prim::CallMethod,
                    prim::CallFunction,
                    prim::CreateObject,
                    prim::Print,
                    prim::RaiseException,
                    prim::isinstance,
                    prim::Enter,
                    prim::Exit,
                    prim::tolist,
                    c10::aten::wait,
                    prim::fork,
                    prim::awaitable});
}

// prim::If: a bool condition, two blocks yielding one value per output.
std::string check_if(const Node* n) {
  const size_t ni = n->inputs().size(), no = n->outputs().size(), nb = n->blocks().size();
  if (ni != 1 || !is(n->input(0), c10::BoolType::get())) return "takes one bool condition";
  if (nb != 2) return "needs two blocks";
  for (const Block* b : n->blocks()) {
    if (!b->inputs().empty()) return "blocks take no inputs";
    if (b->outputs().size() != no)
      return "each block must yield " + std::to_string(no) + " values (one per output)";
  }
  return "";
}

// prim::Loop: trip count, condition, carried values, one block that carries them.
std::string check_loop(const Node* n) {
  const size_t ni = n->inputs().size(), no = n->outputs().size(), nb = n->blocks().size();
  if (ni < 2 || !is(n->input(0), c10::IntType::get()) || !is(n->input(1), c10::BoolType::get()))
    return "takes a trip count (int), a condition (bool) and the carried values";
  const size_t carried = ni - 2;
  if (nb != 1) return "needs one block";
  const Block* b = n->blocks()[0];
  if (b->inputs().size() != carried + 1 || b->outputs().size() != carried + 1 || no != carried)
    return "with " + std::to_string(carried) + " carried values needs a block of " +
           std::to_string(carried + 1) + " inputs and " + std::to_string(carried + 1) +
           " outputs, and " + std::to_string(carried) + " outputs";
  if (!is(b->outputs()[0], c10::BoolType::get())) return "block's first output must be a bool";
  return "";
}

// prim::Constant: no inputs, one output, a value of its type (or None, or a function).
std::string check_constant(const Node* n) {
  const size_t ni = n->inputs().size(), no = n->outputs().size();
  if (ni != 0 || no != 1) return "takes no inputs and has one output";
  if (n->output()->type()->cast<c10::FunctionType>()) return ""; // a function to call
  if (!n->hasAttribute(c10::attr::value)) {
    if (n->output()->type()->kind() != c10::TypeKind::NoneType)
      return "without a value must be NoneType, not " + n->output()->type()->repr_str();
    return "";
  }
  std::optional<c10::IValue> v;
  try {
    v = torch::jit::toIValue(n->output());
  } catch (const std::exception&) {
  }
  if (!v || !v->type()->isSubtypeOf(*n->output()->type()))
    return "value does not fit its type " + n->output()->type()->repr_str();
  return "";
}

// Tuples, lists, dicts, prim::Uninitialized and prim::unchecked_cast; nullopt for
// any other kind.
std::optional<std::string> check_container(const Node* n) {
  const size_t ni = n->inputs().size(), no = n->outputs().size();
  const auto k = n->kind();
  if (k == prim::TupleConstruct) {
    auto t = no == 1 ? n->output()->type()->cast<c10::TupleType>() : nullptr;
    if (!t || t->elements().size() != ni)
      return "must produce a tuple of " + std::to_string(ni) + " elements";
    for (size_t i = 0; i < ni; ++i)
      if (!is(n->input(i), t->elements()[i]))
        return "element " + std::to_string(i) + " does not fit the tuple type";
    return "";
  }
  if (k == prim::TupleUnpack) {
    auto t = ni == 1 ? n->input(0)->type()->cast<c10::TupleType>() : nullptr;
    if (!t || t->elements().size() != no)
      return "must unpack a tuple of " + std::to_string(no) + " elements";
    return "";
  }
  if (k == prim::TupleIndex) {
    if (ni != 2 || no != 1 || !n->input(0)->type()->cast<c10::TupleType>() ||
        !is(n->input(1), c10::IntType::get()))
      return "takes a tuple and an int";
    return "";
  }
  if (k == prim::ListConstruct) {
    auto t = no == 1 ? n->output()->type()->cast<c10::ListType>() : nullptr;
    if (!t) return "must produce a list";
    for (const Value* v : n->inputs())
      if (!is(v, t->getElementType()))
        return "element " + v->type()->repr_str() + " does not fit " + t->repr_str();
    return "";
  }
  if (k == prim::ListUnpack) {
    if (ni != 1 || !n->input(0)->type()->cast<c10::ListType>()) return "takes one list";
    return "";
  }
  if (k == prim::DictConstruct) {
    auto t = no == 1 ? n->output()->type()->cast<c10::DictType>() : nullptr;
    if (!t || ni % 2 != 0) return "must produce a dict from key, value pairs";
    for (size_t i = 0; i < ni; i += 2)
      if (!is(n->input(i), t->getKeyType()) || !is(n->input(i + 1), t->getValueType()))
        return "pair " + std::to_string(i / 2) + " does not fit " + t->repr_str();
    return "";
  }
  if (k == prim::Uninitialized) {
    if (ni != 0 || no != 1) return "takes no inputs and has one output";
    // TorchScript's exit transforms yield it out of a block whose path never
    // reads it (a branch that raises, a loop that breaks); an op that reads it
    // gets no value at run time, and the interpreter dies in an INTERNAL ASSERT.
    for (const torch::jit::Use& u : n->output()->uses()) {
      const auto uk = u.user->kind();
      if (uk == prim::Return || (uk == prim::Loop && u.offset >= 2)) continue;
      return std::string("its value is read by ") + uk.toQualString() +
             "; an uninitialized value may only leave a block (a prim::If or "
             "prim::Loop output, or a loop-carried value)";
    }
    return "";
  }
  if (k == prim::unchecked_cast)
    return ni == 1 && no == 1 ? "" : "takes one input and has one output";
  return std::nullopt;
}

// Objects, calls, futures, context managers, isinstance, tolist, Print and
// RaiseException; nullopt for any other kind.
std::optional<std::string> check_object(const Node* n) {
  const size_t ni = n->inputs().size(), no = n->outputs().size();
  const auto k = n->kind();
  if (k == prim::GetAttr || k == prim::SetAttr) {
    auto cls = ni >= 1 ? n->input(0)->type()->cast<c10::ClassType>() : nullptr;
    if (!n->hasAttribute(c10::attr::name) ||
        n->kindOf(c10::attr::name) != torch::jit::AttributeKind::s)
      return "needs a name attribute";
    if (!cls || !cls->hasAttribute(n->s(c10::attr::name)))
      return "reads an attribute its object does not have";
    if (k == prim::GetAttr ? (ni != 1 || no != 1) : (ni != 2 || no != 0))
      return "has the wrong number of inputs or outputs";
    return "";
  }
  if (k == prim::CallMethod) {
    auto cls = ni >= 1 ? n->input(0)->type()->cast<c10::ClassType>() : nullptr;
    if (!n->hasAttribute(c10::attr::name) ||
        n->kindOf(c10::attr::name) != torch::jit::AttributeKind::s || !cls ||
        !cls->findMethod(n->s(c10::attr::name)))
      return "calls a method its object does not have";
    return "";
  }
  if (k == prim::CallFunction) {
    if (ni < 1 || !n->input(0)->type()->cast<c10::FunctionType>()) return "takes a function first";
    return "";
  }
  if (k == prim::CreateObject) {
    if (ni != 0 || no != 1 || !n->output()->type()->cast<c10::ClassType>())
      return "makes one object of a class";
    return "";
  }
  if (k == c10::aten::wait) {
    if (ni != 1 || no != 1 || !n->input(0)->type()->cast<c10::FutureType>())
      return "takes one Future";
    return "";
  }
  if (k == prim::Enter || k == prim::Exit) {
    if (ni != 1 || !n->input(0)->type()->cast<c10::ClassType>()) return "takes one object";
    return "";
  }
  if (k == prim::isinstance) {
    if (ni != 1 || no != 1 || !n->hasAttribute(c10::Symbol::attr("types")))
      return "takes one value and its types";
    return "";
  }
  if (k == prim::tolist) {
    if (ni != 3 || no != 1 || !is(n->input(0), c10::TensorType::get()) ||
        !is(n->input(1), c10::IntType::get()) || !is(n->input(2), c10::IntType::get()))
      return "takes a tensor, its dim and its element type";
    return "";
  }
  if (k == prim::Print) return no == 0 ? "" : "has no outputs";
  if (k == prim::RaiseException)
    return no == 0 && ni >= 1 && ni <= 2 && is(n->input(0), c10::StringType::get())
               ? ""
               : "takes a message (str) and has no outputs";
  return std::nullopt;
}

// Shape checks of the prims AliasDb and the interpreter handle without a
// schema; "" when fine.
std::string check_prim(const Node* n) {
  const auto k = n->kind();
  if (k == prim::If) return check_if(n);
  if (k == prim::Loop) return check_loop(n);
  if (!n->blocks().empty() && k != prim::Closure) return "cannot have blocks";
  if (needs_subgraph(k) && !n->hasAttribute(c10::attr::Subgraph))
    return "needs a Subgraph attribute";
  if (k == prim::Constant) return check_constant(n);
  if (auto r = check_container(n)) return *r;
  if (auto r = check_object(n)) return *r;
  return "";
}

std::optional<std::string> check_block(const Block* b, bool executor_nodes) {
  for (const Node* n : b->nodes()) {
    const auto k = n->kind();
    if (!executor_nodes && executor_internal(k))
      return k.toQualString() + std::string(" at ") + position(n) +
             ": an internal node of the JIT (made by the graph executor, or needing a Python "
             "object or a subgraph), not accepted in an input graph";
    const torch::jit::Operator* op = nullptr;
    try {
      op = n->maybeOperator();
    } catch (const std::exception&) {
      op = nullptr;
    }
    const auto here = [&] { return k.toQualString() + std::string(" at ") + position(n) + ": "; };
    if (checked_prim(k)) {
      // Shape-checked whether or not an operator is registered for it (this
      // torch registers prim::TupleUnpack and prim::tolist with open schemas).
      const std::string why = check_prim(n);
      if (!why.empty()) return here() + why;
    } else if (op) {
      const auto& schema = op->schema();
      if (!schema.is_varret() && schema.returns().size() != n->outputs().size())
        return here() + "has " + std::to_string(n->outputs().size()) +
               " outputs, its schema returns " + std::to_string(schema.returns().size()) + " (" +
               c10::toString(schema) + ")";
      // A prim taking `...` reads its inputs by a convention no schema states
      // (prim::VarConcat wants tensors then an int): not from user graphs.
      if (!executor_nodes && k.is_prim() && (schema.is_vararg() || schema.is_varret()))
        return here() + "takes a variable argument list whose convention memslim cannot check";
      if (!n->blocks().empty()) return here() + "cannot have blocks";
    } else if (torch::jit::aliasAnalysisHasSpecialCaseFor(k)) {
      if (!executor_nodes)
        return here() +
               "an internal node of the JIT (made by the graph executor, or needing a "
               "Python object or a subgraph), not accepted in an input graph";
      if (needs_subgraph(k) && !n->hasAttribute(c10::attr::Subgraph))
        return here() + "needs a Subgraph attribute";
    } else {
      const auto& candidates = torch::jit::getAllOperatorsFor(k);
      if (candidates.empty())
        return "unknown op " + std::string(k.toQualString()) + " at " + position(n);
      std::string msg = k.toQualString() + std::string(" at ") + position(n) +
                        ": no schema accepts its argument types " + types_of(n->inputs()) +
                        "; candidates: ";
      for (size_t i = 0; i < candidates.size() && i < 4; ++i)
        msg += (i ? "; " : "") + c10::toString(candidates[i]->schema());
      if (candidates.size() > 4) msg += "; ... (" + std::to_string(candidates.size()) + " in all)";
      return msg;
    }
    for (const Block* inner : n->blocks())
      if (auto bad = check_block(inner, executor_nodes)) return bad;
  }
  return std::nullopt;
}

} // namespace

std::optional<std::string> validate_graph(const std::shared_ptr<Graph>& graph,
                                          bool executor_nodes) {
  if (auto bad = check_block(graph->block(), executor_nodes)) return bad;
  try {
    graph->lint();
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    const auto nl = msg.find('\n');
    return "malformed graph: " + (nl == std::string::npos ? msg : msg.substr(0, nl));
  }
  return std::nullopt;
}

void check_graph(const std::shared_ptr<Graph>& graph, bool executor_nodes) {
  if (auto bad = validate_graph(graph, executor_nodes)) TORCH_CHECK(false, *bad);
}

} // namespace memslim
