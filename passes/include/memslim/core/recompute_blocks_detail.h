//===- recompute_blocks_detail.h - what recompute_blocks' files share ------===//
//
// What: the kept-bytes and peak model of recompute_blocks.h (Keeps, Figures, the Pricer:
// what a choice of runs leaves kept and the backward's predicted peak,
// recompute_blocks_price.cpp), and the segment helpers the ladder reads
// (recompute_blocks.cpp): pieces_of, adjacent, describe_run. Not for front ends: they go
// through recompute_blocks.h.
// Why: one decision, split by topic (segments, prices, the ladder) so that each file
// reads on its own.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "memslim/core/recompute_blocks.h"
#include "memslim/core/top_level.h"

namespace memslim::blocks_detail {

inline constexpr size_t kNone = std::numeric_limits<size_t>::max();

// Bytes-relevant facts of the top-level block: what each top-level node makes
// autograd keep (the filters of kept_bytes: no parameters, buffers, constants,
// no-grad inputs), and each value's size.
struct Keeps {
  std::vector<std::vector<const void*>> by_node; // per top-level index
  std::unordered_map<const void*, int64_t> bytes;
  std::string why; // "" or the value whose size is unknown
};

Keeps keeps_of(const Top& t);

// The prices of one choice of runs.
struct Figures {
  int64_t kept = 0, peak = 0;
};

class Pricer {
 public:
  Pricer(const Top& t, const std::vector<Segment>& segs, ApplyAs as = ApplyAs::Op);
  const std::string& why() const { return keeps_.why; }

  Figures price(const std::vector<BlockRun>& runs) const;

  // price(before).kept - price(after).kept, from the values whose keepers, maker or
  // readers lie in units the two choices assign differently (a value's status
  // depends on those alone): a few values per move where price walks the graph.
  // Only where local(): no node in two units.
  int64_t freed(const std::vector<BlockRun>& before, const std::vector<BlockRun>& after) const;
  bool local() const { return local_; }

 private:
  const Top& t_;
  const std::vector<Segment>& segs_;
  Keeps keeps_;
  bool tags_;
  // The kept values (Keeps::bytes' keys) by dense id, so that a price is a few passes
  // over arrays: the budget ladder prices every move of every step.
  std::vector<int64_t> bytes_;                  // per id
  std::vector<std::vector<uint32_t>> keeps_at_; // per top-level index: the ids it keeps
  std::vector<std::vector<uint32_t>> makes_at_; // per top-level index: storages it makes
  std::vector<std::vector<size_t>> nodes_of_;   // per segment: its top-level indices
  std::vector<std::vector<uint32_t>> inputs_;   // per segment: countable input + externals
  // For freed(): each value's keepers (top-level indices), maker and reading units;
  // each unit's values (what it keeps, makes, reads); each top-level index's unit.
  std::vector<std::vector<size_t>> keepers_, readers_;
  std::vector<size_t> maker_, unit_of_;
  std::vector<std::vector<uint32_t>> values_of_;
  bool local_ = true;

  bool kept(uint32_t v, const std::vector<size_t>& run_at) const;
};

// Whether segment a's output is segment a + 1's input (a run may span both).
bool adjacent(const std::vector<Segment>& segs, size_t a);

std::string describe_run(const GraphView& g, const std::vector<Segment>& segs, BlockRun r,
                         const std::string& unit = "segment");

// The pieces of `segments` (split_pieces); `whole`: where given, each segment's pieces
// as a run.
std::vector<Segment> pieces_of(const Top& t, const std::vector<Segment>& segments,
                               std::vector<BlockRun>* whole = nullptr);

} // namespace memslim::blocks_detail
