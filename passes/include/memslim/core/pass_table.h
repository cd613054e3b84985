//===- pass_table.h - every pass and pipeline, declared once ---------------===//
//
// What: the one table of memslim's passes (flag, summary, the policy options it
// reads, where each front end runs it) and the pipelines as data: ordered
// steps, each with the reason it sits there and, where a front end runs a
// different list, the difference and its reason beside the step. memslim-opt
// (--list-passes, --pipeline), the TorchScript registry, the FX front end and
// the torch.compile backend all read these rows; a front end supplies only
// the implementation of each row (jit/pass_registry.cpp, fx/fx_front_end.cpp).
// Why: a pass used to be declared in two registries and three default
// pipelines (C++ TorchScript, C++ FX, Python compile), which drifted apart.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

namespace memslim {

// The ways a graph reaches the passes: TorchScript (memslim.optimize,
// memslim-opt on .pt / IR), FX (torch.export's program: memslim.fx.optimize,
// memslim-opt on .pt2), and FX under torch.compile (the backend, which hands
// the partitioner recompute tags where the others build ops).
enum class FrontEnd { Jit, Fx, Compile };
const char* front_end_name(FrontEnd f); // "TorchScript", "FX", "torch.compile"

struct PassSpec {
  const char* flag;    // kebab-case: the lit file's name, the remark's prefix
  const char* summary; // one sentence for --list-passes
  // The CostPolicy options its decisions read (policy_options() names).
  std::vector<const char*> options;
  // "" where the FX front end runs it; else why not (said by a Note record
  // when the pass is asked for by name).
  const char* fx_absent;
};

struct PipelineStep {
  const char* pass;
  const char* why; // why the step sits here (the order's reason)
  // Where a front end leaves the step out: "" (every front end runs it), or
  // the reason the FX front end skips it (fx_skip) / the compile backend does
  // (compile_skip, which defaults to fx_skip's choice).
  const char* fx_skip = "";
  const char* compile_skip = "";
};

struct PipelineSpec {
  const char* name;
  const char* summary;
  std::vector<PipelineStep> steps;
  // The flags `front_end` runs, in order.
  std::vector<std::string> passes(FrontEnd front_end) const;
};

const std::vector<PassSpec>& pass_table();
const std::vector<PipelineSpec>& pipeline_table();
const PassSpec* find_pass_spec(const std::string& flag);
const PipelineSpec* find_pipeline_spec(const std::string& name);
// The flags to run: `passes` when given (each checked), else `pipeline`'s for
// `front_end`. Throws std::invalid_argument naming an unknown pass / pipeline.
std::vector<std::string> resolve_pipeline(const std::vector<std::string>& passes,
                                          const std::string& pipeline, FrontEnd front_end);

} // namespace memslim
