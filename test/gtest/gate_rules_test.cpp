//===- gate_rules_test.cpp - the gates' named rules: table and the rest ----===//
//
// What: the rules safety_gate_test.cpp's cases do not reach, one graph each
// where exactly that rule refuses (the refusal names it); the rule table
// (core/gate_rules.h) against the TorchScript gate's order; the FX gate's
// checks naming the same rules over a JitGraphView.
// Why: a refusal names its rule; these tests hold each name to the rule that
// proves it.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/gate_rules.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "gate_test_util.h"
#include "memslim/fx/view_gate.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/safety_gate.h"

namespace {

using gate_test::find;
using gate_test::parse;
using gate_test::swap;
using memslim::Proposal;
using memslim::Refusal;
using memslim::Remarks;
using memslim::SafetyGate;
using torch::jit::Graph;
std::optional<Refusal> refusal_of(const std::shared_ptr<Graph>& g, const Proposal& p) {
  Remarks r;
  SafetyGate gate(g, "t", r);
  return gate.named_refusal(p);
}

TEST(SafetyGateRules, EmptyProposal) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %y : Tensor = aten::sigmoid(%x)
  return (%y))IR");
  Proposal p;
  p.site = "nothing";
  auto why = refusal_of(g, p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "empty-proposal");
  EXPECT_EQ(why->reason, "the proposal covers no node (internal)");
}

TEST(SafetyGateRules, NoSchema) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %y : Tensor = aten::sigmoid(%x)
  %z : Tensor = mystery::op(%y)
  return (%z))IR");
  Proposal p = swap(g, find(g, "aten::sigmoid"), "aten::tanh");
  p.covers.push_back(find(g, "mystery::op"));
  auto why = refusal_of(g, p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "no-schema");
  EXPECT_EQ(why->reason, "mystery::op in it matches no registered schema");
  Remarks r;
  SafetyGate gate(g, "t", r);
  EXPECT_EQ(gate.refusal(p), why->reason); // the reason alone
  EXPECT_FALSE(gate.submit(p));
  ASSERT_EQ(r.decisions().size(), 1u);
  EXPECT_EQ(r.decisions()[0].rule, "no-schema"); // the record names the rule
  EXPECT_EQ(r.lines()[0], "remark: t: kept " + p.site + ": " + why->reason);
}

TEST(SafetyGateRules, DeadCode) {
  auto g = parse(R"IR(
graph(%x : Tensor):
  %y : Tensor = aten::sigmoid(%x)
  %z : Tensor = aten::neg(%y)
  return (%x))IR");
  auto why = refusal_of(g, swap(g, find(g, "aten::sigmoid"), "aten::tanh"));
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "dead-code");
  EXPECT_EQ(why->reason, "its result is never used (dead code, left for TorchScript to delete)");
}

TEST(SafetyGateRules, GradModeBetween) {
  auto g = parse(R"IR(
graph(%x : Tensor, %ctx : Any):
  %s : Tensor = aten::sigmoid(%x)
  %e : Any = prim::Enter(%ctx)
  %r : Tensor = aten::mul(%x, %s)
  %q : Any = prim::Exit(%ctx)
  return (%r))IR");
  Proposal p = swap(g, find(g, "aten::mul"), "aten::silu");
  p.covers.push_back(find(g, "aten::sigmoid"));
  auto why = refusal_of(g, p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "grad-mode-between");
  EXPECT_EQ(why->reason,
            "prim::Enter (a with-block: grad mode, autocast) begins or ends between its nodes");
}

TEST(SafetyGateRules, ReplayedWrite) {
  // A replaying rewrite (block recompute) may take over a covered write only of
  // what its nodes make: here add_ writes the graph input.
  auto g = parse(R"IR(
graph(%x : Tensor):
  %one : int = prim::Constant[value=1]()
  %h : Tensor = aten::sigmoid(%x)
  %w : Tensor = aten::add_(%x, %h, %one)
  return (%w))IR");
  Proposal p = swap(g, find(g, "aten::add_"), "aten::add");
  p.covers.push_back(find(g, "aten::sigmoid"));
  p.replays_writes = true;
  auto why = refusal_of(g, p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "replayed-write");
  EXPECT_EQ(why->reason, "aten::add_ in it writes %x in place");
}

TEST(SafetyGateRules, NestedWrite) {
  // A node nested in a covered If runs inside the rewrite: it may not write
  // what the covered nodes read from outside.
  auto g = parse(R"IR(
graph(%x : Tensor, %c : bool):
  %one : int = prim::Constant[value=1]()
  %r : Tensor = prim::If(%c)
    block0():
      %w : Tensor = aten::add_(%x, %x, %one)
      -> (%w)
    block1():
      %s : Tensor = aten::sigmoid(%x)
      -> (%s)
  return (%r))IR");
  Proposal p;
  p.site = "the If";
  p.covers = {find(g, "prim::If")};
  p.apply = [] { return std::string(); };
  auto why = refusal_of(g, p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, "nested-write");
  EXPECT_EQ(why->reason, "aten::add_ in it writes %x in place");
}

TEST(SafetyGateRules, TableListsEachRuleOnceInTheScriptGatesOrder) {
  const auto& rules = memslim::gate_rules();
  std::vector<memslim::GateRule> script;
  for (size_t i = 0; i < rules.size(); ++i) {
    const memslim::GateRuleInfo& r = rules[i];
    EXPECT_EQ(static_cast<size_t>(r.id), i) << r.name; // GateRule order
    EXPECT_EQ(memslim::find_gate_rule(r.name), &r) << r.name;
    const std::string name = r.name;
    EXPECT_FALSE(name.empty());
    for (char ch : name) EXPECT_TRUE((ch >= 'a' && ch <= 'z') || ch == '-') << name;
    EXPECT_NE(std::string(r.summary), "") << name;
    EXPECT_NE(r.gates, 0u) << name;
    if (r.gates & memslim::kScriptGate) script.push_back(r.id);
  }
  EXPECT_EQ(SafetyGate::rules(), script); // every script rule, checked in table order
  EXPECT_EQ(memslim::find_gate_rule("no-such-rule"), nullptr);
}

TEST(SafetyGateRules, ViewGateNamesTheSameRules) {
  // The FX gate's checks over a JitGraphView of the graphs above: each refusal
  // names a rule the table says the FX gate implements.
  using memslim::JitGraphView;
  auto fx_rule = [](const std::optional<Refusal>& r) {
    EXPECT_TRUE(r);
    if (!r) return std::string();
    const memslim::GateRuleInfo* info = memslim::find_gate_rule(r->rule);
    EXPECT_TRUE(info && (info->gates & memslim::kFxGate)) << r->rule;
    return r->rule;
  };
  auto between = parse(R"IR(
graph(%x : Tensor, %x2 : Tensor):
  %one : int = prim::Constant[value=1]()
  %h : Tensor = aten::neg(%x)
  %s : Tensor = aten::sigmoid(%h)
  %w : Tensor = aten::add_(%h, %one, %one)
  %r : Tensor = aten::mul(%h, %s)
  %y : Tensor = aten::silu_(%x2)
  return (%r, %y))IR");
  const JitGraphView bv(between);
  const memslim::ViewGate bg(bv);
  const auto sig = JitGraphView::ref(find(between, "aten::sigmoid"));
  const auto mul = JitGraphView::ref(find(between, "aten::mul"));
  const auto h = JitGraphView::ref(find(between, "aten::neg")->output());
  EXPECT_EQ(fx_rule(bg.refusal_between({sig, mul})), "write-between");
  EXPECT_EQ(fx_rule(bg.refusal(sig, {h})), "write-after-guarded");
  const auto silu_ = JitGraphView::ref(find(between, "aten::silu_"));
  EXPECT_EQ(fx_rule(bg.refusal_removed_write(silu_, JitGraphView::ref(between->inputs()[1]))),
            "observable-write");
  EXPECT_EQ(bg.check_removed_write(silu_, JitGraphView::ref(between->inputs()[1])),
            "its input is a graph input"); // the string form: the reason alone
  auto with = parse(R"IR(
graph(%x : Tensor, %ctx : Any):
  %s : Tensor = aten::sigmoid(%x)
  %e : Any = prim::Enter(%ctx)
  %r : Tensor = aten::mul(%x, %s)
  return (%r))IR");
  const JitGraphView wv(with);
  const memslim::ViewGate wg(wv);
  EXPECT_EQ(fx_rule(wg.refusal_between({JitGraphView::ref(find(with, "aten::sigmoid")),
                                        JitGraphView::ref(find(with, "aten::mul"))})),
            "grad-mode-between");
}

} // namespace
