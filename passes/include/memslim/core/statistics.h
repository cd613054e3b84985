//===- statistics.h - per-pass statistics from the decision records --------===//
//
// What: MLIR-style pass statistics (sites decided, rewritten, kept by reason,
// rolled back, bytes freed, and the bytes the rewritten sites keep before /
// after) counted from the decision records a run made, and their rendering as
// memslim-opt --stats prints them and memslim.report(...).statistics() returns
// them (memslim.summary reads those). Why from the records: every front end
// already makes one record per decision, so the counts cannot disagree with the
// remarks, and no pass keeps counters of its own.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memslim/core/decision.h"

namespace memslim {

struct PassStatistics {
  std::string pass;
  int64_t sites = 0;       // decisions about a site: rewritten + kept
  int64_t rewritten = 0;   // Rewrote records
  int64_t kept = 0;        // Kept records (the pass's reasons and the gate's)
  int64_t rolled_back = 0; // the pass threw or left a graph that did not lint
  int64_t bytes_freed = 0; // the rewrites' priced bytes freed (the cost model's figure)
  // What the rewritten sites keep for backward before / after the rewrites (priced
  // sites only; bytes_before - bytes_after == bytes_freed): memslim.summary's figures.
  int64_t bytes_before = 0;
  int64_t bytes_after = 0;
  // Kept records by reason, most frequent first: the reason with its numbers
  // and value names masked ("frees N B, below the N B minimum").
  std::vector<std::pair<std::string, int64_t>> kept_by_reason;
};

// One entry per pass, in the order the passes first appear in `decisions`.
std::vector<PassStatistics> pass_statistics(const std::vector<Decision>& decisions);
// A reason's class: numbers -> N, %values -> %v, cut before " (".
std::string reason_class(const std::string& reason);
// The report memslim-opt --stats prints (MLIR's "Pass statistics report").
std::string render_statistics(const std::vector<PassStatistics>& stats);

} // namespace memslim
