//===- safety_gate_test.cpp - unit tests of the SafetyGate and run_pass ----===//
//
// What: the gate's named rules (core/gate_rules.h: stale nodes, blocks, loops,
// writes between and after, module state by attribute path, removed writes,
// CSE twins, the executor's chains and hazards) on small IR graphs, each test
// asserting the rule that refuses (the other rules: gate_rules_test.cpp); the
// analysis facts they read; and the driver's transaction: a pass that throws
// or leaves a graph that does not lint is rolled back with one remark, or
// rethrown in strict mode.
//
//===----------------------------------------------------------------------===//
#include "memslim/jit/safety_gate.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/script.h>

#include <cmath>
#include <cstring>
#include <optional>

#include "gate_test_util.h"
#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/saved_tensor_analysis.h"

namespace {

using gate_test::find;
using gate_test::parse;
using gate_test::swap;
using memslim::Proposal;
using memslim::Refusal;
using memslim::Remarks;
using memslim::SafetyGate;
using torch::jit::Graph;
using torch::jit::Node;

// The gate's refusal of swapping `ir`'s sigmoid for tanh, with `token` in the IR
// replaced by `with` (one graph, variants of one node).
std::optional<Refusal> sigmoid_swap_refusal(std::string ir, const char* token, const char* with) {
  ir.replace(ir.find(token), std::strlen(token), with);
  auto g = parse(ir);
  memslim::Remarks remarks;
  SafetyGate gate(g, "test", remarks);
  return gate.named_refusal(swap(g, find(g, "aten::sigmoid"), "aten::tanh"));
}

TEST(SafetyGate, AppliesAndDropsCoveredNodes) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %y : Tensor = aten::sigmoid(%x)
  return (%y))IR");
  Remarks r;
  SafetyGate gate(g, "t", r);
  Node* s = find(g, "aten::sigmoid");
  EXPECT_TRUE(gate.submit(swap(g, s, "aten::tanh")));
  EXPECT_FALSE(gate.alive(s));
  EXPECT_EQ(find(g, "aten::sigmoid"), nullptr);
  ASSERT_NE(find(g, "aten::tanh"), nullptr);
  ASSERT_EQ(r.lines().size(), 1u);
  EXPECT_EQ(r.lines()[0], "remark: t: swapped");
  g->lint();
}

TEST(SafetyGate, RefusesStaleProposals) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %y : Tensor = aten::sigmoid(%x)
  return (%y))IR");
  Remarks r;
  SafetyGate gate(g, "t", r);
  Node* s = find(g, "aten::sigmoid");
  Proposal again = swap(g, s, "aten::relu");
  ASSERT_TRUE(gate.submit(swap(g, s, "aten::tanh")));
  EXPECT_FALSE(gate.submit(again)); // `s` is gone: never dereferenced
  EXPECT_NE(r.lines().back().find("an earlier rewrite changed it"), std::string::npos);
  // The record names the rule; the remark text does not.
  EXPECT_EQ(r.decisions().back().rule, "stale-node");
  EXPECT_EQ(r.lines().back(), "remark: t: kept " + again.site + ": an earlier rewrite changed it");
  EXPECT_EQ(r.decisions().front().rule, ""); // applied
}

TEST(SafetyGate, RefusesWriteBetweenCoveredNodes) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %one : int = prim::Constant[value=1]()
  %h : Tensor = aten::neg(%x)
  %s : Tensor = aten::sigmoid(%h)
  %w : Tensor = aten::add_(%h, %one, %one)
  %r : Tensor = aten::mul(%h, %s)
  return (%r))IR");
  Remarks r;
  SafetyGate gate(g, "t", r);
  Proposal p = swap(g, find(g, "aten::mul"), "aten::silu");
  p.covers.push_back(find(g, "aten::sigmoid"));
  auto why = gate.named_refusal(p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "write-between");
  EXPECT_NE(why->reason.find("aten::add_ writes %"), std::string::npos) << why->reason;
  EXPECT_NE(why->reason.find("in place between its nodes"), std::string::npos) << why->reason;
}

TEST(SafetyGate, RefusesLaterWriteToGuardedValueOrView) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %one : int = prim::Constant[value=1]()
  %shape : int[] = prim::Constant[value=[-1]]()
  %none : str = prim::Constant[value="none"]()
  %h : Tensor = aten::neg(%x)
  %y : Tensor = aten::gelu(%h, %none)
  %v : Tensor = aten::view(%y, %shape)
  %w : Tensor = aten::add_(%v, %one, %one)
  return (%w))IR");
  Remarks r;
  SafetyGate gate(g, "t", r);
  auto why = gate.named_refusal(swap(g, find(g, "aten::gelu"), "memslim::gelu"));
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "write-after-guarded");
  EXPECT_NE(why->reason.find("aten::add_ later writes"), std::string::npos) << why->reason;
}

TEST(SafetyGate, EarlierWriteIsHarmless) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %one : int = prim::Constant[value=1]()
  %h : Tensor = aten::neg(%x)
  %none : str = prim::Constant[value="none"]()
  %w : Tensor = aten::add_(%h, %one, %one)
  %y : Tensor = aten::gelu(%h, %none)
  return (%y))IR");
  Remarks r;
  SafetyGate gate(g, "t", r);
  EXPECT_FALSE(gate.named_refusal(swap(g, find(g, "aten::gelu"), "memslim::gelu")));
}

TEST(SafetyGate, RefusesLoopsAndSplitBlocks) {
  auto g = parse(R"IR(
graph(%x : Tensor, %n : int, %c : bool):
  %t : bool = prim::Constant[value=1]()
  %y : Tensor = prim::Loop(%n, %t, %x)
    block0(%i : int, %a : Tensor):
      %b : Tensor = aten::sigmoid(%a)
      -> (%t, %b)
  %z : Tensor = prim::If(%c)
    block0():
      %s : Tensor = aten::sigmoid(%y)
      -> (%s)
    block1():
      -> (%y)
  %u : Tensor = aten::tanh(%z)
  return (%u))IR");
  Remarks r;
  SafetyGate gate(g, "t", r);
  auto loop = gate.named_refusal(swap(g, find(g, "aten::sigmoid", 0), "aten::tanh"));
  ASSERT_TRUE(loop);
  EXPECT_EQ(loop->rule, "inside-loop");
  EXPECT_EQ(loop->reason, "inside a loop (not analysed)");
  Proposal split = swap(g, find(g, "aten::tanh"), "aten::relu");
  split.covers.push_back(find(g, "aten::sigmoid", 1));
  auto blocks = gate.named_refusal(split);
  ASSERT_TRUE(blocks);
  EXPECT_EQ(blocks->rule, "one-block");
  EXPECT_EQ(blocks->reason, "its nodes lie in different blocks");
}

TEST(SafetyGate, ModuleStateByAttributePath) {
  // BatchNorm's num_batches_tracked.add_(1) "writes" every attribute (and
  // every graph input) for AliasDb (one wildcard); the gate tells attributes
  // apart by path, and a fresh value (h) from module state.
  torch::jit::Module m("M");
  m.register_parameter("order", torch::ones({}), false);
  m.register_buffer("num_batches_tracked", torch::zeros({}, at::kLong));
  m.define(R"(
def forward(self, x):
    h = x.neg()
    y = h * self.order
    self.num_batches_tracked.add_(1)
    self.order.mul_(2)
    return y
)");
  std::shared_ptr<Graph> g = m.get_method("forward").graph();
  Remarks r;
  SafetyGate gate(g, "t", r);
  Proposal p = swap(g, find(g, "aten::mul"), "aten::mul");
  p.guarded = {p.covers[0]->input(0), p.covers[0]->input(1), p.covers[0]->output()};
  auto why = gate.named_refusal(p);
  ASSERT_TRUE(why); // the mul_ on self.order, not the add_ on num_batches_tracked
  EXPECT_EQ(why->rule, "write-after-guarded");
  EXPECT_NE(why->reason.find("aten::mul_ later writes"), std::string::npos) << why->reason;
  EXPECT_EQ(memslim::module_state_path(p.covers[0]->input(1)), "self.order");
}

TEST(SafetyGate, WriteToATensorAnOpMadeIsApartFromWildcards) {
  // memcnn's downsampling `out += residual` after a coupling: `d` is a tensor
  // neg made, yet once a chunk splits it AliasDb counts it among the
  // wildcards with every attribute read, graph input and chunk piece. A write
  // to it writes neither self.w, nor the graph input r, nor x.neg()'s pieces,
  // nor the mul's output; a guarded d itself is written.
  torch::jit::Module m("M");
  m.register_parameter("w", torch::ones({}), false);
  m.define(R"(
def forward(self, x, r):
    a, b = x.neg().chunk(2, 1)
    y = a * self.w
    d = r.neg()
    d.add_(1)
    c, e = d.chunk(2, 1)
    return c * e + b + y
)");
  std::shared_ptr<Graph> g = m.get_method("forward").graph();
  Remarks rm;
  SafetyGate gate(g, "t", rm);
  Proposal p = swap(g, find(g, "aten::mul"), "aten::mul");
  p.guarded = {p.covers[0]->input(0), p.covers[0]->input(1), p.covers[0]->output(), g->inputs()[2]};
  // (executor-chain-write, checked after it, refuses this toy graph for its own
  // reason: the executor may group neg and add_ with the mul.)
  auto first = gate.named_refusal(p);
  EXPECT_TRUE(!first || first->rule != "write-after-guarded") << first->reason;
  p.guarded.push_back(find(g, "aten::neg", 1)->output()); // d itself
  auto why = gate.named_refusal(p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "write-after-guarded");
}

TEST(SafetyGate, WriteToAnIfOutputIsNoWriteToATensorAnOpMade) {
  // The rule above needs the written tensor's one maker: `t` is d or e by the
  // branch taken (storage_root follows one branch, d's), so a write to it may
  // write the guarded e, which another op (exp) made. AliasDb says so; the
  // gate agrees (the rule as first written took d's maker and let it through).
  torch::jit::Module m("M");
  m.register_parameter("w", torch::ones({}), false);
  m.define(R"(
def forward(self, x, r, c: bool):
    a, b = x.neg().chunk(2, 1)
    y = a * self.w
    d = r.neg()
    e = r.exp()
    if c:
        t = d
    else:
        t = e
    t.add_(1)
    p, q = t.chunk(2, 1)
    return p * q + b + y + e
)");
  std::shared_ptr<Graph> g = m.get_method("forward").graph();
  Remarks rm;
  SafetyGate gate(g, "t", rm);
  Proposal p = swap(g, find(g, "aten::mul"), "aten::mul");
  p.guarded = {p.covers[0]->input(0), p.covers[0]->input(1), p.covers[0]->output(),
               find(g, "aten::exp")->output()};
  auto why = gate.named_refusal(p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "write-after-guarded");
  EXPECT_NE(why->reason.find("aten::add_ later writes"), std::string::npos) << why->reason;
}

TEST(SafetyGate, WriteToATypeAsResultMayWriteItsInput) {
  // type_as returns its input where the types match (TorchScript's peephole
  // folds it so), though its schema declares a new tensor: u may be the graph
  // input r, and a chunk puts u among AliasDb's wildcards with r. No tensor
  // "an op made" there: the write to u is a write to a guarded r.
  torch::jit::Module m("M");
  m.register_parameter("w", torch::ones({}), false);
  m.define(R"(
def forward(self, x, r):
    a, b = x.neg().chunk(2, 1)
    y = a * self.w
    u = r.type_as(x)
    u.add_(1)
    p, q = u.chunk(2, 1)
    return p * q + b + y
)");
  std::shared_ptr<Graph> g = m.get_method("forward").graph();
  Remarks rm;
  SafetyGate gate(g, "t", rm);
  Proposal p = swap(g, find(g, "aten::mul"), "aten::mul");
  p.guarded = {p.covers[0]->input(0), p.covers[0]->input(1), p.covers[0]->output(), g->inputs()[2]};
  auto why = gate.named_refusal(p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "write-after-guarded");
}

TEST(SafetyGate, RemovedWriteMustBeUnobservable) {
  auto g = parse(R"IR(
graph(%x : Tensor, %x2 : Tensor):
  %h : Tensor = aten::neg(%x)
  %y : Tensor = aten::silu_(%h)
  %z : Tensor = aten::silu_(%x2)
  return (%y, %z))IR");
  Remarks r;
  SafetyGate gate(g, "t", r);
  Proposal fresh = swap(g, find(g, "aten::silu_", 0), "aten::silu");
  Proposal input = swap(g, find(g, "aten::silu_", 1), "aten::silu");
  auto writes = gate.named_refusal(fresh); // writes in place: refused unless declared
  ASSERT_TRUE(writes);
  EXPECT_EQ(writes->rule, "writes-in-place");
  EXPECT_EQ(writes->reason, "aten::silu_ in it writes in place or has side effects");
  fresh.removes_writes = input.removes_writes = true;
  EXPECT_FALSE(gate.named_refusal(fresh));
  auto why = gate.named_refusal(input);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "observable-write");
  EXPECT_EQ(why->reason, "its input is a graph input");
}

// The graph's node kinds in order (value numbers change on restore).
std::string kinds(const std::shared_ptr<Graph>& g) {
  std::string out;
  torch::jit::DepthFirstGraphNodeIterator it(const_cast<std::shared_ptr<Graph>&>(g));
  for (Node* n = it.next(); n; n = it.next()) out += std::string(n->kind().toQualString()) + " ";
  return out + std::to_string(g->inputs().size()) + "->" + std::to_string(g->outputs().size());
}

// The driver: transactions over whole passes.
void throwing_pass(const std::shared_ptr<Graph>& g, memslim::PassContext& ctx) {
  ctx.remarks.add({"throwing", memslim::Decision::Verdict::Rewrote, "", "rewrote something", {}});
  memslim::replace_output(*g, find(g, "aten::sigmoid"), find(g, "aten::sigmoid")->output(),
                          c10::Symbol::fromQualString("aten::tanh"),
                          find(g, "aten::sigmoid")->inputs());
  throw std::runtime_error("half-way\nsecond line");
}

void unlinted_pass(const std::shared_ptr<Graph>& g, memslim::PassContext&) {
  // Reads a value before it is defined: lint fails.
  Node* s = find(g, "aten::sigmoid");
  Node* first = g->block()->nodes().front();
  first->replaceInput(0, s->output());
}

TEST(RunPass, RollsBackAThrowingPass) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %h : Tensor = aten::neg(%x)
  %y : Tensor = aten::sigmoid(%h)
  return (%y))IR");
  const std::string before = kinds(g);
  memslim::PassContext ctx;
  memslim::PassInfo p{"throwing", "", throwing_pass};
  memslim::run_pass(p, g, ctx);
  EXPECT_EQ(kinds(g), before);
  g->lint();
  ASSERT_EQ(ctx.remarks.lines().size(), 1u);
  EXPECT_EQ(ctx.remarks.lines()[0],
            "remark: throwing: rolled back (the graph is as before this pass): half-way");
  ctx.strict = true;
  EXPECT_THROW(memslim::run_pass(p, g, ctx), std::runtime_error);
}

TEST(RunPass, RollsBackAGraphThatDoesNotLint) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %h : Tensor = aten::neg(%x)
  %y : Tensor = aten::sigmoid(%h)
  return (%y))IR");
  const std::string before = kinds(g);
  memslim::PassContext ctx;
  memslim::run_pass({"unlinted", "", unlinted_pass}, g, ctx);
  EXPECT_EQ(kinds(g), before);
  g->lint();
  ASSERT_EQ(ctx.remarks.lines().size(), 1u);
  EXPECT_NE(ctx.remarks.lines()[0].find("rolled back"), std::string::npos);
}

// The analysis facts the gate and the passes share (saved_tensor_analysis.h).
TEST(SavedTensorAnalysis, StorageRootThroughViewsInPlaceAndDropout) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %zero : int = prim::Constant[value=0]()
  %p : float = prim::Constant[value=0.5]()
  %f : bool = prim::Constant[value=0]()
  %h : Tensor = aten::exp(%x)
  %r : Tensor = aten::relu_(%h)
  %u : Tensor = aten::unsqueeze(%r, %zero)
  %d : Tensor = aten::dropout(%u, %p, %f)
  return (%d))IR");
  using memslim::SavedTensorAnalysis;
  const torch::jit::Value* h = find(g, "aten::exp")->output();
  bool hidden = true;
  EXPECT_EQ(SavedTensorAnalysis::storage_root(find(g, "aten::unsqueeze")->output(), &hidden), h);
  EXPECT_FALSE(hidden);
  EXPECT_EQ(SavedTensorAnalysis::storage_root(find(g, "aten::dropout")->output(), &hidden), h);
  EXPECT_TRUE(hidden); // an alias AliasDb does not see
}

TEST(SavedTensorAnalysis, FusedDropoutDrawsRandomNumbersUnlessNotTraining) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %p : float = prim::Constant[value=0.5]()
  %t : bool = prim::Constant[value=1]()
  %f : bool = prim::Constant[value=0]()
  %act : str = prim::Constant[value="gelu"]()
  %l : float[] = prim::ListConstruct()
  %i : int = prim::Constant[value=1]()
  %a : Tensor = memslim::activation_dropout(%x, %act, %l, %p, %t, %i)
  %b : Tensor = memslim::activation_dropout(%x, %act, %l, %p, %f, %i)
  %c : Tensor = aten::dropout(%x, %p, %t)
  return (%a, %b, %c))IR");
  using memslim::SavedTensorAnalysis;
  EXPECT_TRUE(SavedTensorAnalysis::draws_random(find(g, "memslim::activation_dropout", 0)));
  EXPECT_FALSE(SavedTensorAnalysis::draws_random(find(g, "memslim::activation_dropout", 1)));
  EXPECT_TRUE(SavedTensorAnalysis::draws_random(find(g, "aten::dropout")));
}

TEST(SavedTensorAnalysis, SqrtRsqrtReciprocalKeepTheirOutput) {
  // Measured with saved_tensors_hooks: aten saves the result for these three.
  auto g = parse(R"IR(
graph(%x : Tensor):
  %a : Tensor = aten::sqrt(%x)
  %b : Tensor = aten::rsqrt(%a)
  %c : Tensor = aten::reciprocal(%b)
  %d : Tensor = aten::log(%c)
  return (%d))IR");
  using memslim::SavedTensorAnalysis;
  for (const char* k : {"aten::sqrt", "aten::rsqrt", "aten::reciprocal"}) {
    EXPECT_TRUE(SavedTensorAnalysis::keeps_output(find(g, k))) << k;
    EXPECT_FALSE(SavedTensorAnalysis::keeps_input(find(g, k), 0)) << k;
  }
  EXPECT_TRUE(SavedTensorAnalysis::keeps_input(find(g, "aten::log"), 0));
}

TEST(SafetyGate, MadeOpIsNoCseTwinOfAHiddenWrite) {
  // x * sigmoid(x) -> silu(x) beside the user's silu(x), whose output an eval-mode
  // dropout returns and mul_ writes: torch's CSE would merge the two (long-fuzz 161800).
  auto g = parse(R"IR(
graph(%x : Tensor):
  %p : float = prim::Constant[value=0.5]()
  %f : bool = prim::Constant[value=0]()
  %s : Tensor = aten::sigmoid(%x)
  %r : Tensor = aten::mul(%x, %s)
  %u : Tensor = aten::silu(%x)
  %d : Tensor = aten::dropout(%u, %p, %f)
  %w : Tensor = aten::mul_(%d, %p)
  return (%r, %d))IR");
  Remarks remarks;
  SafetyGate gate(g, "test", remarks);
  Proposal p;
  p.site = "x * sigmoid(x)";
  p.covers = {find(g, "aten::mul"), find(g, "aten::sigmoid")};
  p.makes = {{c10::Symbol::fromQualString("aten::silu"), g->inputs()[0]}};
  p.apply = [] { return std::string(); };
  auto why = gate.named_refusal(p);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->rule, "cse-twin");
  EXPECT_NE(why->reason.find("torch's CSE may merge the new aten::silu"), std::string::npos)
      << why->reason;
  // Without the write the same proposal passes.
  find(g, "aten::mul_")->destroy();
  SafetyGate clean(g, "test", remarks);
  EXPECT_FALSE(clean.named_refusal(p).has_value());
}

TEST(SavedTensorAnalysis, PeepholeMayFoldScalarIdentities) {
  // TorchScript's peephole pass replaces x * 1, x / 1, x + 0, x - 0 by x; inside a loop
  // the executor unrolls, `x * (i + 1)` is x * 1 on the first trip (long-fuzz 208175).
  auto g = parse(R"IR(
graph(%x : Tensor, %s : float):
  %one : int = prim::Constant[value=1]()
  %two : int = prim::Constant[value=2]()
  %zero : float = prim::Constant[value=0.]()
  %t : bool = prim::Constant[value=1]()
  %a : Tensor = aten::mul(%x, %one)
  %b : Tensor = aten::mul(%x, %two)
  %c : Tensor = aten::add(%x, %zero, %one)
  %d : Tensor = aten::mul(%x, %s)
  %e : Tensor = aten::div(%x, %one)
  %l : Tensor = prim::Loop(%two, %t, %x)
    block0(%i : int, %acc : Tensor):
      %k : int = aten::add(%i, %one)
      %f : Tensor = aten::mul(%x, %k)
      %g : Tensor = aten::add(%acc, %f, %one)
      -> (%t, %g)
  return (%a, %b, %c, %d, %e, %l))IR");
  using memslim::SavedTensorAnalysis;
  const auto* x = g->inputs()[0];
  EXPECT_TRUE(SavedTensorAnalysis::may_fold_to_input(find(g, "aten::mul", 0)));
  EXPECT_FALSE(SavedTensorAnalysis::may_fold_to_input(find(g, "aten::mul", 1)));
  EXPECT_TRUE(SavedTensorAnalysis::may_fold_to_input(find(g, "aten::add", 0)));
  EXPECT_FALSE(SavedTensorAnalysis::may_fold_to_input(find(g, "aten::mul", 2))); // a free scalar
  EXPECT_TRUE(SavedTensorAnalysis::may_fold_to_input(find(g, "aten::div")));
  EXPECT_TRUE(SavedTensorAnalysis::may_fold_to_input(find(g, "aten::mul", 3)));  // x * (i + 1)
  EXPECT_FALSE(SavedTensorAnalysis::may_fold_to_input(find(g, "aten::add", 1))); // int add
  EXPECT_FALSE(SavedTensorAnalysis::may_fold_to_input(find(g, "aten::add", 2))); // tensor + tensor
  EXPECT_EQ(SavedTensorAnalysis::storage_root(find(g, "aten::mul", 0)->output()), x);
  EXPECT_EQ(SavedTensorAnalysis::storage_root(find(g, "aten::mul", 3)->output()), x);
  EXPECT_NE(SavedTensorAnalysis::storage_root(find(g, "aten::mul", 1)->output()), x);
}

TEST(SafetyGate, ExecutorChainFollowsUnrolledLoops) {
  // A rewrite after a constant-trip loop joins the unrolled body's graph, which keeps
  // v0 * (i + 1), folded to v0 itself; silu_ writes v0 after the loop (long-fuzz 208175).
  const std::string ir = R"IR(
graph(%x : Tensor, %n : int):
  %one : int = prim::Constant[value=1]()
  %two : int = prim::Constant[value=2]()
  %twenty : int = prim::Constant[value=20]()
  %t : bool = prim::Constant[value=1]()
  %v0 : Tensor = aten::relu(%x)
  %l : Tensor = prim::Loop(TRIPS, %t, %x)
    block0(%i : int, %acc : Tensor):
      %k : int = aten::add(%i, %one)
      %v2 : Tensor = aten::mul(%v0, %k)
      %sp : Tensor = aten::softplus(%v2, %one, %twenty)
      %a : Tensor = aten::add(%acc, %sp, %one)
      -> (%t, %a)
  %w : Tensor = aten::silu_(%v0)
  %s : Tensor = aten::sigmoid(%l)
  return (%s, %w))IR";
  auto with_trips = [&](const char* trips) {
    std::string text = ir;
    text.replace(text.find("TRIPS"), 5, trips);
    return parse(text);
  };
  Remarks remarks;
  auto g = with_trips("%two");
  SafetyGate gate(g, "test", remarks);
  auto why = gate.named_refusal(swap(g, find(g, "aten::sigmoid"), "aten::tanh"));
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->rule, "executor-chain-write");
  EXPECT_NE(why->reason.find("TorchScript's executor may keep"), std::string::npos) << why->reason;
  EXPECT_NE(why->reason.find("aten::silu_ writes it in place"), std::string::npos) << why->reason;
  // A loop whose trip count is not known stays a loop: the chain stops at it.
  auto g2 = with_trips("%n");
  SafetyGate gate2(g2, "test", remarks);
  EXPECT_FALSE(gate2.named_refusal(swap(g2, find(g2, "aten::sigmoid"), "aten::tanh")).has_value());
}

TEST(SafetyGate, HiddenDropoutAliasKeepsEveryRewrite) {
  // hardsigmoid_ writes %h through an eval-mode dropout and %y reads %h: AliasDb sees two
  // tensors, so any regrouping may reorder them (long-fuzz 205868). A rewrite elsewhere
  // is kept; without the other reader it is not.
  const char* ir = R"IR(
graph(%x : Tensor):
  %p : float = prim::Constant[value=0.5]()
  %f : bool = prim::Constant[value=0]()
  %h : Tensor = aten::relu(%x)
  %d : Tensor = aten::dropout(%h, %p, %f)
  %w : Tensor = aten::hardsigmoid_(%d)
  %y : Tensor = aten::mul(READ, %p)
  %s : Tensor = aten::sigmoid(%x)
  return (%y, %s, %d))IR";
  std::string with_read = ir, without = ir;
  with_read.replace(with_read.find("READ"), 4, "%h");
  without.replace(without.find("READ"), 4, "%x");
  Remarks remarks;
  auto g = parse(with_read);
  SafetyGate gate(g, "test", remarks);
  auto why = gate.named_refusal(swap(g, find(g, "aten::sigmoid"), "aten::tanh"));
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->rule, "hidden-alias");
  EXPECT_NE(why->reason.find("through a dropout that may return it"), std::string::npos)
      << why->reason;
  auto g2 = parse(without);
  SafetyGate gate2(g2, "test", remarks);
  EXPECT_FALSE(gate2.named_refusal(swap(g2, find(g2, "aten::sigmoid"), "aten::tanh")).has_value());
  // Two dropouts in a row: a write through the second and a read of the first's output
  // meet on one tensor that AliasDb sees as two.
  auto g3 = parse(R"IR(
graph(%x : Tensor):
  %p : float = prim::Constant[value=0.5]()
  %f : bool = prim::Constant[value=0]()
  %h : Tensor = aten::relu(%x)
  %d1 : Tensor = aten::dropout(%h, %p, %f)
  %d2 : Tensor = aten::dropout(%d1, %p, %f)
  %w : Tensor = aten::hardsigmoid_(%d2)
  %y : Tensor = aten::mul(%d1, %p)
  %s : Tensor = aten::sigmoid(%x)
  return (%y, %s, %d2))IR");
  SafetyGate gate3(g3, "test", remarks);
  auto two = gate3.named_refusal(swap(g3, find(g3, "aten::sigmoid"), "aten::tanh"));
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->rule, "hidden-alias");
  // The write and a read on the other side of the dropout, where the read uses what the
  // write made (zoo models with p = 0: relu_ -> dropout -> linear): data flow orders them,
  // also through a loop's carried value. The same read of a dropout taken before the
  // write is not ordered.
  const char* ordered = R"IR(
graph(%x : Tensor):
  %p : float = prim::Constant[value=0.5]()
  %f : bool = prim::Constant[value=0]()
  %t : bool = prim::Constant[value=1]()
  %n : int = prim::Constant[value=2]()
  %h : Tensor = aten::relu(%x)
  DROPOUT_BEFORE
  %w : Tensor = aten::hardsigmoid_(%h)
  DROPOUT_AFTER
  %l : Tensor = prim::Loop(%n, %t, %d)
    block0(%i : int, %acc : Tensor):
      %y : Tensor = aten::mul(%acc, %p)
      -> (%t, %y)
  %s : Tensor = aten::sigmoid(%x)
  return (%l, %s))IR";
  auto place = [&](bool before) {
    std::string s = ordered;
    const std::string d =
        "%d : Tensor = aten::dropout(" + std::string(before ? "%h" : "%w") + ", %p, %f)";
    s.replace(s.find("DROPOUT_BEFORE"), 14, before ? d : "");
    s.replace(s.find("DROPOUT_AFTER"), 13, before ? "" : d);
    return parse(s);
  };
  auto g4 = place(false);
  SafetyGate gate4(g4, "test", remarks);
  EXPECT_FALSE(gate4.named_refusal(swap(g4, find(g4, "aten::sigmoid"), "aten::tanh")).has_value());
  auto g5 = place(true);
  SafetyGate gate5(g5, "test", remarks);
  auto unordered = gate5.named_refusal(swap(g5, find(g5, "aten::sigmoid"), "aten::tanh"));
  ASSERT_TRUE(unordered.has_value());
  EXPECT_EQ(unordered->rule, "hidden-alias");
}

TEST(SavedTensorAnalysis, InPlaceDropoutWritesNothingAtPZeroOrEval) {
  // ATen's _dropout_impl returns its input untouched when p == 0 or not training.
  auto g = parse(R"IR(
graph(%x : Tensor, %p : float, %train : bool):
  %zero : float = prim::Constant[value=0.]()
  %half : float = prim::Constant[value=0.5]()
  %t : bool = prim::Constant[value=1]()
  %f : bool = prim::Constant[value=0]()
  %a : Tensor = aten::dropout_(%x, %zero, %train)
  %b : Tensor = aten::dropout_(%x, %half, %f)
  %c : Tensor = aten::dropout_(%x, %half, %t)
  %d : Tensor = aten::dropout_(%x, %p, %t)
  %e : Tensor = aten::feature_alpha_dropout_(%x, %zero, %t)
  return (%a, %b, %c, %d, %e))IR");
  using memslim::SavedTensorAnalysis;
  EXPECT_TRUE(SavedTensorAnalysis::written_inputs(find(g, "aten::dropout_", 0)).empty());
  EXPECT_TRUE(SavedTensorAnalysis::written_inputs(find(g, "aten::dropout_", 1)).empty());
  EXPECT_EQ(SavedTensorAnalysis::written_inputs(find(g, "aten::dropout_", 2)).size(), 1u);
  EXPECT_EQ(SavedTensorAnalysis::written_inputs(find(g, "aten::dropout_", 3)).size(), 1u);
  EXPECT_TRUE(SavedTensorAnalysis::writes_nothing(find(g, "aten::feature_alpha_dropout_")));
}

} // namespace

TEST(SafetyGate, ExecutorHazardKeepsEveryRewrite) {
  // Programs TorchScript's executor fails on for some cuts of its graphs: a rewrite
  // anywhere (sigmoid -> tanh of an unrelated input) is kept. Each variant changes one
  // token: the written view's base from a computed tensor to the graph input (no
  // hazard: eager would raise itself), the chunk piece from dead to returned.
  const char* ir = R"IR(
graph(%x : Tensor, %y : Tensor):
  %two : float = prim::Constant[value=2.]()
  %i2 : int = prim::Constant[value=2]()
  %i1 : int = prim::Constant[value=1]()
  %v3 : Tensor = aten::mul(%y, %two)
  %v5 : Tensor = aten::t(BASE)
  %v6 : Tensor = aten::silu_(%v5)
  %c : Tensor[] = aten::chunk(%v3, %i2, %i1)
  %a : Tensor, %b : Tensor = prim::ListUnpack(%c)
  %s : Tensor = aten::sigmoid(%x)
  return (%s, %v6, %b, PIECE))IR";
  auto variant = [&](const char* base, const char* piece) {
    std::string s = ir;
    s.replace(s.find("BASE"), 4, base);
    s.replace(s.find("PIECE"), 5, piece);
    return parse(s);
  };
  Remarks remarks;
  auto refusal = [&](const std::shared_ptr<Graph>& g) {
    SafetyGate gate(g, "test", remarks);
    return gate.named_refusal(swap(g, find(g, "aten::sigmoid"), "aten::tanh"));
  };
  auto view = refusal(variant("%v3", "%a"));
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->rule, "executor-hazard");
  EXPECT_NE(view->reason.find("in place, a view (aten::t) of %"), std::string::npos)
      << view->reason;
  auto chunk = refusal(variant("%y", "%x"));
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ(chunk->rule, "executor-hazard");
  EXPECT_NE(chunk->reason.find("reaches no result"), std::string::npos) << chunk->reason;
  EXPECT_FALSE(refusal(variant("%y", "%a")).has_value());
}

TEST(SafetyGate, WriteToOutputTorchScriptKeepsIsAHazard) {
  // Long-fuzz seed 363139: an in-place write to softplus's output trains in eager
  // (softplus keeps its input) and raises scripted once the executor puts softplus
  // in a DifferentiableGraph (its symbolic gradient reads the output). Every
  // rewrite is kept; hardsigmoid's symbolic gradient reads its input: no hazard.
  const char* ir = R"IR(
graph(%x : Tensor, %y : Tensor):
  %one : float = prim::Constant[value=1.]()
  %i1 : int = prim::Constant[value=1]()
  %a : Tensor = ACT(%x)
  %w : Tensor = aten::add_(%a, %one, %i1)
  %s : Tensor = aten::sigmoid(%y)
  return (%w, %s))IR";
  auto refusal = [&](const char* act) { return sigmoid_swap_refusal(ir, "ACT", act); };
  auto why = refusal("aten::hardswish");
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->rule, "executor-hazard");
  EXPECT_NE(why->reason.find(", the output of aten::hardswish, in place"), std::string::npos)
      << why->reason;
  EXPECT_FALSE(refusal("aten::hardsigmoid").has_value());
}

TEST(SafetyGate, ExecutorChainReachesEnclosingBlocks) {
  // A rewrite inside an If's branch reading a value of the block around it: that
  // block's chain counts (seed 363139: a region in an else-branch regrouped the
  // outer softplus into a graph keeping the output a later write touched).
  // Without the outer write (WRITE -> a plain read) nothing is kept.
  const char* ir = R"IR(
graph(%x : Tensor, %c : bool):
  %nn : str = prim::Constant[value="none"]()
  %one : float = prim::Constant[value=1.]()
  %i1 : int = prim::Constant[value=1]()
  %m : Tensor = aten::mul(%x, %one)
  %a : Tensor = aten::gelu(%m, %nn)
  %w : Tensor = WRITE(%a, %one, %i1)
  %r : Tensor = prim::If(%c)
    block0():
      -> (%w)
    block1():
      %s : Tensor = aten::sigmoid(%m)
      -> (%s)
  return (%r))IR";
  auto refusal = [&](const char* write) { return sigmoid_swap_refusal(ir, "WRITE", write); };
  auto why = refusal("aten::add_");
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->rule, "executor-chain-write");
  EXPECT_NE(why->reason.find("DifferentiableGraph"), std::string::npos) << why->reason;
  EXPECT_FALSE(refusal("aten::add").has_value());
}

// The policy table (passes/core/policy.cpp): flag text reads as a typed value, and
// a CostPolicy set field by field is checked by the same rows.
TEST(Policy, OneTableParsesAndChecks) {
  using memslim::PolicyValue;
  EXPECT_EQ(PolicyValue::parse("12").kind, PolicyValue::Kind::Int);
  EXPECT_EQ(PolicyValue::parse("1.5").kind, PolicyValue::Kind::Double);
  EXPECT_EQ(PolicyValue::parse("x").kind, PolicyValue::Kind::Text);
  EXPECT_EQ(PolicyValue::parse("").kind, PolicyValue::Kind::Text);
  EXPECT_TRUE(std::isnan(PolicyValue::parse("nan").d));

  memslim::CostPolicy p;
  EXPECT_EQ(memslim::policy_error(p), "");
  p.min_bytes = -1;
  EXPECT_EQ(memslim::policy_error(p),
            "min_bytes must be an integer in [0, 9223372036854775807], got -1");
  p = {};
  p.max_added_work = std::nan("");
  EXPECT_NE(memslim::policy_error(p).find("max_added_work must be a number >= 0"),
            std::string::npos);
  p = {};
  p.assume_numel = int64_t(1) << 41;
  EXPECT_NE(memslim::policy_error(p).find("assume_numel must be an integer in [0, 1099511627776]"),
            std::string::npos);
  p = {};
  p.dropout_mask_bytes = 2;
  EXPECT_EQ(memslim::policy_error(p), "dropout_mask_bytes must be 0 or 1, got 2");
  p.dropout_mask_bytes = -1; // automatic
  EXPECT_EQ(memslim::policy_error(p), "");

  const memslim::PolicyOption* o = memslim::find_policy_option("--assume-numel");
  ASSERT_NE(o, nullptr);
  EXPECT_STREQ(o->name, "assume_numel");
  memslim::CostPolicy q;
  EXPECT_EQ(o->set(q, PolicyValue::parse("1e3")), ""); // an integer-valued number
  EXPECT_EQ(q.assume_numel, 1000);
  EXPECT_NE(o->set(q, PolicyValue::parse("1.5")), "");
  EXPECT_EQ(memslim::find_policy_option("--no-such"), nullptr);
}
