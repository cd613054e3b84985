//===- memory_budget.cpp - the memory-budget planner (TorchScript) ---------===//
//
// What: memory_budget = B runs a pipeline so that the graph keeps at most B of
// what the unmodified graph keeps for backward (B a fraction in (0, 1], or
// bytes): nothing when it already does; else the pipeline's rewrites (each
// frees bytes for at most a couple of activation evaluations per element,
// cheaper per byte than any recompute), then, if that is not enough, the
// shortest prefix of the block ladder (core/recompute_blocks.h: recompute
// whole blocks, then runs of them, by bytes freed per added forward work,
// never raising the predicted peak of the backward) that meets B. The ladder
// does not depend on B, so a smaller budget never keeps more bytes or has a
// higher predicted peak. A budget the whole ladder cannot meet is an error
// naming the smallest reachable figure; remarks say what was chosen and why.
// Why here: the planner drives passes (run_pass) the way optimize() and
// memslim-opt do; the choices themselves are made in the core.
//
//===----------------------------------------------------------------------===//
#include <cmath>
#include <sstream>

#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/recompute_blocks.h"

namespace memslim {

using torch::jit::Graph;

namespace {

// What the planner's pass reads and reports (one planner per thread at a time).
struct BudgetRun {
  int64_t target = 0;
  int64_t reached = 0; // what the chosen step keeps
  bool feasible = true;
  std::string why; // no ladder (sizes unknown)
};
thread_local BudgetRun* g_run = nullptr;

std::string mb(int64_t bytes) {
  if (bytes < 1000000) return std::to_string(bytes) + " B";
  std::ostringstream o;
  o.precision(3);
  o << double(bytes) / 1e6 << " MB";
  return o.str();
}

void run_planned_blocks(const std::shared_ptr<Graph>& g, PassContext& ctx) {
  BudgetRun& run = *g_run;
  hoist_nested_attributes(*g);
  const JitGraphView view(g);
  // Blocks the gate (or the op's argument types) would refuse stay out of the
  // ladder, so that the figures it plans are the figures applied.
  std::vector<Segment> segments = find_segments(view);
  for (size_t i = 0; i < segments.size(); ++i)
    if (segments[i].why.empty()) {
      const RecomputeBlock b = run_block(view, segments, {i, i + 1}, kMemoryBudgetPass);
      segments[i].why = block_refusal(g, b, ctx);
    }
  const BlockLadder ladder = block_ladder(view, std::move(segments), run.target, ctx.policy);
  if (!ladder.why.empty() || ladder.steps.empty()) {
    run.why = ladder.why.empty() ? "no blocks" : ladder.why;
    run.feasible = false;
    return;
  }
  const size_t step = ladder.steps.size() - 1;
  const LadderStep& s = ladder.steps[step];
  run.reached = s.kept;
  run.feasible = s.kept <= run.target;
  if (!run.feasible) return;
  std::ostringstream o;
  o << "ladder step " << step << ": " << s.runs.size() << " recomputed run(s) of "
    << ladder.segments.size() << " blocks found; keeps " << mb(s.kept) << " (budget "
    << mb(run.target) << "), predicted backward peak " << mb(s.peak) << " (from "
    << mb(ladder.steps[0].peak) << "), added forward work " << s.flops / 1e9 << " GFLOP";
  ctx.remarks.note(kMemoryBudgetPass, o.str());
  for (size_t i = 1; i <= step; ++i)
    ctx.remarks.note(kMemoryBudgetPass, "step " + std::to_string(i) + ": " + ladder.steps[i].move +
                                            " -> keeps " + mb(ladder.steps[i].kept) + ", peak " +
                                            mb(ladder.steps[i].peak));
  std::vector<RecomputeBlock> blocks = ladder_blocks(view, ladder, step);
  apply_recompute_blocks(g, blocks, ctx);
}

int64_t kept_now(const std::shared_ptr<Graph>& g, const char* when) {
  const JitGraphView view(g);
  std::string unknown;
  const auto b = total_kept_bytes(view, &unknown);
  TORCH_CHECK(b, "memory_budget: ", when, ", the size of ", unknown,
              ", kept for backward, is unknown (give example inputs)");
  return *b;
}

} // namespace

void run_with_memory_budget(const std::vector<const PassInfo*>& plan,
                            const std::shared_ptr<Graph>& g, PassContext& ctx,
                            const std::function<void(const PassInfo&)>& after) {
  const double budget = ctx.policy.memory_budget;
  const int64_t b0 = kept_now(g, "before any rewrite");
  BudgetRun run;
  run.target = budget <= 1 ? int64_t(std::floor(budget * double(b0))) : int64_t(budget);
  std::ostringstream head;
  head << "budget " << mb(run.target) << " of the unmodified " << mb(b0);
  if (b0 <= run.target) {
    ctx.remarks.note(kMemoryBudgetPass, head.str() + ": met as it is, nothing rewritten");
    return;
  }
  for (const PassInfo* p : plan) {
    run_pass(*p, g, ctx);
    if (after) after(*p);
  }
  const int64_t b1 = kept_now(g, "after the pipeline");
  if (b1 <= run.target) {
    ctx.remarks.note(kMemoryBudgetPass,
                     head.str() + ": met by the pipeline's rewrites (keeps " + mb(b1) + ")");
    return;
  }
  ctx.remarks.note(kMemoryBudgetPass, head.str() + ": the pipeline's rewrites keep " + mb(b1) +
                                          "; recomputing blocks");
  g_run = &run;
  static const PassInfo kPlanned{kMemoryBudgetPass,
                                 "the memory-budget planner's block recompute (internal)",
                                 run_planned_blocks};
  try {
    run_pass(kPlanned, g, ctx);
  } catch (...) {
    g_run = nullptr;
    throw;
  }
  g_run = nullptr;
  if (after) after(kPlanned);
  TORCH_CHECK(run.why.empty(), "memory_budget: cannot plan block recompute: ", run.why);
  TORCH_CHECK(run.feasible, "memory_budget ", budget, " (", run.target, " B of the unmodified ", b0,
              " B) cannot be met: the smallest reachable is ", run.reached, " B (",
              double(run.reached) / double(b0),
              " of the unmodified) without raising the backward's predicted peak");
  const int64_t b2 = kept_now(g, "after block recompute");
  TORCH_CHECK(b2 <= run.target, "memory_budget ", budget, " (", run.target,
              " B) cannot be met: the safety gate kept planned blocks (memslim.report() says "
              "which); the graph keeps ",
              b2, " B");
}

} // namespace memslim
