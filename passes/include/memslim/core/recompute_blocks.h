//===- recompute_blocks.h - whole blocks that keep only their inputs -------===//
//
// What: finds the model's blocks, the pieces between two single values of
// the data flow (a residual block from its input to its output, a transformer
// sub-layer, a stem's conv -> bn -> relu -> pool), prices recomputing them
// (keep the block's input and the state it reads; re-run it in backward, as
// torch.utils.checkpoint does by hand), and plans which blocks, and which runs
// of adjacent blocks, to recompute to meet a memory budget.
// A block (a "segment") starts at a value x of the data flow (something a
// graph input flows into, not module state) and is every top-level node that
// reads x or what those nodes make, up to the first node after which exactly
// one of those values (y, a tensor) is read later and x is not: it is a
// function y = B(x, state) with nothing else escaping. Walking from the graph
// inputs, each block's output starts the next one, so the blocks found form
// chains (ResNet: stem ops, then one block per residual block; BERT: one per
// attention and per MLP sub-layer).
// The planner is a fixed ladder, independent of the budget: starting from
// nothing recomputed, each step takes the move (recompute one block or two
// adjacent ones; extend a recomputed run by its neighbour; merge two adjacent
// runs) that frees the most bytes per unit of added forward work, among the
// moves that free bytes and do not raise the predicted peak of the backward.
// A budget takes the shortest prefix that meets it: a smaller budget walks
// further down the same ladder, so it never keeps more bytes and never has a
// higher predicted peak (monotone by construction). The peak model: at the
// start of backward everything kept is alive; when a run's backward re-runs
// it, what is kept and read at or before it (liveness: later keepers are done)
// plus what its re-run keeps for its own backward.
// Two ways to apply a run, priced differently (ApplyAs): as one op (the
// TorchScript front end, passes/recompute_blocks.cpp and memory_budget.cpp,
// cuts it out as graph text for memslim::recompute_block: it keeps its input,
// and what it returns is kept where a later node keeps it), or as recompute
// tags (the FX front end under torch.compile: Inductor's partitioner
// recomputes every value made inside the run, for readers after it too, and
// keeps what the run reads from outside). Tags need no single input and
// output, so that ladder's units are pieces of the blocks: each convolution or
// matrix product alone, and each stretch of cheap ops between two of them, so
// it can recompute a norm and an activation without the convolution before
// them, or one convolution of a block (what torch.compile's knapsack picks
// from) instead of the whole block.
// Why here: matching, pricing and planning are front-end neutral.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"
#include "memslim/core/top_level.h"

namespace memslim {

inline constexpr const char* kRecomputeBlocksPass = "recompute-blocks";
inline constexpr const char* kMemoryBudgetPass = "memory-budget";
inline constexpr const char* kRecomputeBlockOp = "memslim::recompute_block";

// One block of the data flow: y = B(x, external...).
struct Segment {
  FunctionCut fn;
  size_t first = 0, last = 0; // top-level indices of its first and last node
  std::string why;            // "" or why it cannot become an op
  double flops = 0;           // its forward work (a multiply-add counts 2)
  bool joins_next = false;    // the next one reads what this one makes (a run may span both)
  bool heavy = false;         // it holds a convolution or matrix product (see split_pieces)
};

// How a front end applies a ladder's runs (see the top of this file).
enum class ApplyAs { Op, Tags };

// Segments [begin, end) of the found list, adjacent (each one's output is the
// next one's input), recomputed as one op.
struct BlockRun {
  size_t begin = 0, end = 0;
  bool operator==(const BlockRun& o) const { return begin == o.begin && end == o.end; }
};

// One rewrite as the front end applies it.
struct RecomputeBlock {
  Decision decision; // Rewrote, or Kept with why
  FunctionCut fn;
  std::vector<NodeRef> covers;   // the run's nodes, program order
  std::vector<ValueRef> guarded; // its input, output and tensor external reads
  bool rewrite() const { return decision.verdict == Decision::Verdict::Rewrote; }
};

// The segments of the top-level block, in program order.
std::vector<Segment> find_segments(const GraphView& g);

// recompute-blocks on its own: every segment of two or more nodes that frees
// at least policy.min_bytes (per-block checkpointing, decided per block).
std::vector<RecomputeBlock> find_recompute_blocks(const GraphView& g, const CostPolicy& policy);

// The bytes the whole graph makes autograd keep (the cost model's figure the
// budget is a fraction of); nullopt where a size is unknown (its name in
// `unknown`).
std::optional<int64_t> total_kept_bytes(const GraphView& g, std::string* unknown = nullptr);

struct LadderStep {
  std::vector<BlockRun> runs; // recomputed, in program order
  int64_t kept = 0;           // predicted bytes kept for backward
  int64_t peak = 0;           // predicted peak of the backward (see above)
  double flops = 0;           // added forward work
  std::string move;           // "recompute %y5 (1 block)", "merge ...", "" for step 0
  bool light = true;          // no run holds a heavy unit: pointwise and norm re-runs only,
                              // which Inductor fuses into the backward's kernels
};

struct BlockLadder {
  std::vector<Segment> segments; // the units runs index: segments, or pieces for tags
  std::vector<LadderStep> steps; // steps[0]: nothing recomputed
  std::string why;               // "" or why no ladder (sizes unknown)
};

// The pieces of `segments` (program order): each heavy node (a convolution
// or matrix product: more than 4 FLOPs per element it makes) alone, and each
// stretch of other nodes between two heavy ones; a piece takes its segment's
// why. fn.input is the first value it reads from outside, fn.output the last
// it makes, fn.external everything it reads from outside.
std::vector<Segment> split_pieces(const GraphView& g, const std::vector<Segment>& segments);

// The ladder over g's `segments` (find_segments, with `why` set by the front
// end where it cannot apply one: its safety gate, a type its op cannot carry),
// walked until a step keeps at most `stop_at` bytes or no move remains
// (stop_at < 0: to the end). With ApplyAs::Tags its units are the segments'
// pieces (split_pieces) and runs are priced as tags.
BlockLadder block_ladder(const GraphView& g, std::vector<Segment> segments, int64_t stop_at,
                         const CostPolicy& policy, ApplyAs as = ApplyAs::Op);

// The rewrite recomputing `run` of `segments` (Kept where a segment has a why).
RecomputeBlock run_block(const GraphView& g, const std::vector<Segment>& segments, BlockRun run,
                         const std::string& pass);

// The rewrites for one step of the ladder, in program order.
std::vector<RecomputeBlock> ladder_blocks(const GraphView& g, const BlockLadder& ladder,
                                          size_t step);

} // namespace memslim
