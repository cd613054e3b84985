//===- recompute_blocks.cpp - blocks -> memslim::recompute_block ------------===//
//
// What: the TorchScript front end of block recompute (core/recompute_blocks.h):
// each block (or run of blocks) becomes one memslim::recompute_block op
// carrying the block as IR text (nested blocks included; constants copied in;
// bool / int / float reads boxed into 0-dim tensors, int[] into 1-dim ones,
// str reads (StochasticDepth's mode) passed in the op's str[] argument;
// module attributes read under an If first hoisted out of it, so that the
// block reads their values, not the module), so autograd keeps the
// block's input and the state it reads instead of its intermediates.
// The pass `recompute-blocks` on its own recomputes every block that frees
// memory (per-block checkpointing, decided by the cost model); the
// memory-budget planner (memory_budget.cpp) applies the runs its ladder chose.
// Safety: through the SafetyGate, covering the run's nodes, guarding its
// input, output and every tensor it reads.
//
//===----------------------------------------------------------------------===//
#include "memslim/jit/recompute_blocks.h"

#include <algorithm>
#include <unordered_set>

#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/graph_text.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

namespace {

// The gate's proposal for `b` (its text cut out), or why there is none.
std::string proposal_for(const std::shared_ptr<Graph>& g, const RecomputeBlock& b, Proposal& prop) {
  std::string text;
  const std::string why = cut_function_text(b.fn, text, /*strs=*/true);
  if (!why.empty()) return why;
  Value* x = JitGraphView::value(b.fn.input);
  Value* y = JitGraphView::value(b.fn.output);
  std::vector<Value*> state, strs;
  for (ValueRef e : b.fn.external) {
    Value* v = JitGraphView::value(e);
    (passes_as_str(v) ? strs : state).push_back(v);
  }
  prop.site = b.decision.site;
  for (NodeRef n : b.covers) prop.covers.push_back(JitGraphView::node(n));
  for (ValueRef v : b.guarded) prop.guarded.push_back(JitGraphView::value(v));
  Node* point = prop.covers.back(); // the op takes the place of the run's last node
  std::unordered_set<const Node*> covered(prop.covers.begin(), prop.covers.end());
  prop.apply = [&g, x, y, state, strs, text, point, covered]() {
    torch::jit::WithInsertPoint guard(point);
    Value* list = insert_state_list(*g, state);
    // The str[]? argument is always there (None without strs): AliasDb matches a
    // node's schema by its inputs, defaults not filled in.
    Value* str_list = strs.empty()
                          ? g->insertConstant(c10::IValue())
                          : g->insertNode(g->createList(c10::StringType::get(), strs))->output();
    Node* op =
        g->insertNode(g->create(c10::Symbol::fromQualString(kRecomputeBlockOp),
                                {x, list, g->insertConstant(c10::IValue(text)), str_list}, 1));
    redirect_outside_uses(y, op->output(), covered);
    return std::string();
  };
  prop.replays_writes = true;
  prop.rewrote = b.decision.site + " " + b.decision.text;
  prop.price = b.decision.price;
  return "";
}

void submit_block(const std::shared_ptr<Graph>& g, RecomputeBlock& b, PassContext& ctx) {
  Proposal prop;
  const std::string why = proposal_for(g, b, prop);
  if (!why.empty()) {
    b.decision.verdict = Decision::Verdict::Kept;
    b.decision.text = why;
    ctx.remarks.add(std::move(b.decision));
    return;
  }
  ctx.gate->submit(prop);
}

} // namespace

void hoist_nested_attributes(Graph& g) {
  std::shared_ptr<Graph> graph = g.shared_from_this();
  torch::jit::DepthFirstGraphNodeIterator it(graph);
  for (Node* n = it.next(); n; n = it.next())
    if (n->kind() == c10::prim::SetAttr) return;
  for (bool moved = true; moved;) {
    moved = false;
    std::vector<std::pair<Node*, Node*>> moves; // (attribute read, its top-level owner)
    torch::jit::DepthFirstGraphNodeIterator walk(graph);
    for (Node* n = walk.next(); n; n = walk.next()) {
      if (n->kind() != c10::prim::GetAttr || n->owningBlock() == g.block() ||
          n->input(0)->node()->owningBlock() != g.block())
        continue;
      Node* top = n;
      while (top->owningBlock()->owningNode()) top = top->owningBlock()->owningNode();
      moves.emplace_back(n, top);
    }
    for (auto [n, top] : moves) n->moveBefore(top);
    moved = !moves.empty();
  }
}

void apply_recompute_blocks(const std::shared_ptr<Graph>& g, std::vector<RecomputeBlock>& blocks,
                            PassContext& ctx) {
  // Last first: an earlier run's output stays the value a later op reads
  // until that op exists, and the earlier run's nodes stay untouched.
  for (size_t i = blocks.size(); i-- > 0;) {
    if (!blocks[i].rewrite()) {
      ctx.remarks.add(std::move(blocks[i].decision));
      continue;
    }
    submit_block(g, blocks[i], ctx);
  }
}

std::string block_refusal(const std::shared_ptr<Graph>& g, const RecomputeBlock& b,
                          PassContext& ctx) {
  Proposal prop;
  const std::string why = proposal_for(g, b, prop);
  if (!why.empty()) return why;
  return ctx.gate->refusal(prop).value_or("");
}

void run_recompute_blocks(const std::shared_ptr<Graph>& g, PassContext& ctx) {
  hoist_nested_attributes(*g);
  const JitGraphView view(g);
  std::vector<RecomputeBlock> blocks = find_recompute_blocks(view, ctx.policy);
  apply_recompute_blocks(g, blocks, ctx);
}

} // namespace memslim
