//===- recompute_blocks_ladder.cpp - the budget ladder of recompute blocks -===//
//
// What: block_ladder (recompute_blocks.h): from nothing recomputed, each step takes the
// move (a new run of one or two units, a whole segment for tags, an extension by a
// neighbour, a merge of two runs, for tags a join with the next run) that frees the most
// bytes per unit of added forward work without raising the predicted peak; ladder_blocks,
// one step's rewrites.
// Why: the planner apart from the segments it walks over (recompute_blocks.cpp) and the
// prices it compares (recompute_blocks_price.cpp).
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <string>
#include <vector>

#include "memslim/core/recompute_blocks.h"
#include "memslim/core/recompute_blocks_detail.h"

namespace memslim {

namespace {

using blocks_detail::adjacent;
using blocks_detail::describe_run;
using blocks_detail::Figures;
using blocks_detail::kNone;
using blocks_detail::Pricer;

// A candidate move: the runs after it, the forward work it adds, what it does.
struct Move {
  std::vector<BlockRun> runs;
  double flops;
  std::string what;
};

// The moves from one step's runs, in the order the ladder weighs them (the first of
// equal scores wins).
struct Moves {
  const GraphView& g;
  const std::vector<Segment>& segs;
  const std::vector<BlockRun>& runs; // the step's, in program order
  const std::string& unit;           // "segment" or "piece"
  std::vector<size_t> run_of;        // per unit: the run holding it, or kNone
  std::vector<Move> list;

  Moves(const GraphView& g, const std::vector<Segment>& segs, const std::vector<BlockRun>& runs,
        const std::string& unit)
      : g(g), segs(segs), runs(runs), unit(unit), run_of(segs.size(), kNone) {
    for (size_t r = 0; r < runs.size(); ++r)
      for (size_t s = runs[r].begin; s < runs[r].end; ++s) run_of[s] = r;
  }
  bool valid(size_t s) const { return segs[s].why.empty(); }
  static std::vector<BlockRun> with(std::vector<BlockRun> rs) {
    std::sort(rs.begin(), rs.end(),
              [](const BlockRun& a, const BlockRun& b) { return a.begin < b.begin; });
    return rs;
  }

  // A new run of one segment, or of two adjacent free ones.
  void new_runs() {
    for (size_t s = 0; s < segs.size(); ++s) {
      if (run_of[s] != kNone || !valid(s)) continue;
      {
        auto rs = runs;
        rs.push_back({s, s + 1});
        list.push_back(
            {with(rs), segs[s].flops, "recompute " + describe_run(g, segs, {s, s + 1}, unit)});
      }
      if (adjacent(segs, s) && run_of[s + 1] == kNone && valid(s + 1)) {
        auto rs = runs;
        rs.push_back({s, s + 2});
        list.push_back({with(rs), segs[s].flops + segs[s + 1].flops,
                        "recompute " + describe_run(g, segs, {s, s + 2}, unit)});
      }
    }
  }

  // A whole segment, taking in the runs that overlap it (one run).
  void whole_segments(const std::vector<BlockRun>& whole) {
    for (const BlockRun& w : whole) {
      bool ok = w.end - w.begin > 1, inside = true;
      double flops = 0;
      for (size_t s = w.begin; s < w.end; ++s) {
        ok = ok && valid(s);
        inside = inside && run_of[s] != kNone && run_of[s] == run_of[w.begin];
        if (run_of[s] == kNone) flops += segs[s].flops;
      }
      if (!ok || inside) continue;
      BlockRun cover = w;
      std::vector<BlockRun> rs;
      for (const BlockRun& r : runs)
        if (r.end <= w.begin || r.begin >= w.end) {
          rs.push_back(r);
        } else {
          cover.begin = std::min(cover.begin, r.begin);
          cover.end = std::max(cover.end, r.end);
        }
      rs.push_back(cover);
      list.push_back({with(rs), flops, "recompute " + describe_run(g, segs, cover, unit)});
    }
  }

  // A run extended by the free neighbour on either side, or merged with the next run.
  void extensions() {
    for (size_t r = 0; r < runs.size(); ++r) {
      const BlockRun cur = runs[r];
      if (cur.begin > 0 && adjacent(segs, cur.begin - 1) && run_of[cur.begin - 1] == kNone &&
          valid(cur.begin - 1)) {
        auto rs = runs;
        rs[r] = {cur.begin - 1, cur.end};
        list.push_back({with(rs), segs[cur.begin - 1].flops,
                        "extend to " + describe_run(g, segs, rs[r], unit)});
      }
      if (adjacent(segs, cur.end - 1) && cur.end < segs.size()) {
        if (run_of[cur.end] == kNone && valid(cur.end)) {
          auto rs = runs;
          rs[r] = {cur.begin, cur.end + 1};
          list.push_back(
              {with(rs), segs[cur.end].flops, "extend to " + describe_run(g, segs, rs[r], unit)});
        } else if (run_of[cur.end] != kNone) {
          // Merge with the next run: no added work, one boundary less kept.
          auto rs = runs;
          const size_t other = run_of[cur.end];
          rs[r] = {cur.begin, runs[other].end};
          rs.erase(rs.begin() + long(other));
          list.push_back(
              {with(rs), 0,
               "merge into " + describe_run(g, segs, {cur.begin, runs[other].end}, unit)});
        }
      }
    }
  }

  // Tags: a move that makes a run touch the next one may also join them (no
  // work added, their boundary freed), in the same step: a piece joined to a
  // run often frees nothing until the boundary it leaves goes too.
  void joins() {
    for (size_t i = 0, n = list.size(); i < n; ++i) {
      std::vector<BlockRun> joined;
      for (const BlockRun& r : list[i].runs)
        if (!joined.empty() && joined.back().end == r.begin && adjacent(segs, r.begin - 1))
          joined.back().end = r.end;
        else
          joined.push_back(r);
      if (joined.size() == list[i].runs.size()) continue;
      Move m{joined, list[i].flops, list[i].what + ", joined to its neighbour"};
      list.push_back(std::move(m));
    }
  }
};

// The move freeing the most bytes per added work without raising the peak (its
// figures in `best_f`), or null; the first of equal scores. Moves are scored by their
// freed bytes (Pricer::freed where local, a whole price else) and priced whole in the
// order of their scores until one keeps the peak: the same move as pricing every one.
const Move* best_move(const Pricer& pricer, const std::vector<BlockRun>& runs,
                      const std::vector<Move>& moves, const Figures& now, int64_t min_freed,
                      Figures& best_f) {
  std::vector<std::pair<double, size_t>> order;
  for (size_t i = 0; i < moves.size(); ++i) {
    const int64_t freed = pricer.local() ? pricer.freed(runs, moves[i].runs)
                                         : now.kept - pricer.price(moves[i].runs).kept;
    if (freed >= min_freed) order.emplace_back(double(freed) / (moves[i].flops + 1.0), i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& x, const auto& y) { return x.first > y.first; });
  for (const auto& [score, i] : order) {
    const Figures f = pricer.price(moves[i].runs);
    if (f.peak > now.peak) continue;
    best_f = f;
    return &moves[i];
  }
  return nullptr;
}

} // namespace

BlockLadder block_ladder(const GraphView& g, std::vector<Segment> segments, int64_t stop_at,
                         const CostPolicy& policy, ApplyAs as) {
  const Top t(g);
  BlockLadder L;
  // Tags: the units are pieces, and a whole segment is a move of its own (the
  // greedy need not find a path to it piece by piece).
  std::vector<BlockRun> whole;
  L.segments =
      as == ApplyAs::Tags ? blocks_detail::pieces_of(t, segments, &whole) : std::move(segments);
  const std::vector<Segment>& segs = L.segments;
  const Pricer pricer(t, segs, as);
  const std::string unit = as == ApplyAs::Tags ? "piece" : "segment";
  if (!pricer.why().empty()) {
    L.why = "the size of " + pricer.why() + " is unknown";
    return L;
  }
  LadderStep step;
  Figures now = pricer.price({});
  step.kept = now.kept;
  step.peak = now.peak;
  L.steps.push_back(step);
  const int64_t min_freed = std::max<int64_t>(policy.min_bytes, 1);
  while (stop_at < 0 || step.kept > stop_at) {
    Moves moves(g, segs, step.runs, unit);
    moves.new_runs();
    moves.whole_segments(whole);
    moves.extensions();
    if (as == ApplyAs::Tags) moves.joins();
    Figures best_f;
    const Move* best = best_move(pricer, step.runs, moves.list, now, min_freed, best_f);
    if (!best) break;
    step.runs = best->runs;
    step.light = true;
    for (const BlockRun& r : step.runs)
      for (size_t s = r.begin; s < r.end; ++s) step.light = step.light && !segs[s].heavy;
    step.kept = best_f.kept;
    step.peak = best_f.peak;
    step.flops += best->flops;
    step.move = best->what;
    now = best_f;
    L.steps.push_back(step);
  }
  return L;
}

std::vector<RecomputeBlock> ladder_blocks(const GraphView& g, const BlockLadder& ladder,
                                          size_t step) {
  std::vector<RecomputeBlock> out;
  const LadderStep& s = ladder.steps.at(step);
  for (const BlockRun& r : s.runs) {
    RecomputeBlock b = run_block(g, ladder.segments, r, kMemoryBudgetPass);
    if (b.decision.text.empty()) {
      b.decision.verdict = Decision::Verdict::Rewrote;
      b.decision.text = "-> " + std::string(kRecomputeBlockOp) +
                        ": keeps its input and state; re-runs it in backward";
    }
    out.push_back(std::move(b));
  }
  return out;
}

} // namespace memslim
