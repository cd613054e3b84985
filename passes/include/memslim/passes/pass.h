//===- pass.h - pass interface, policy, remarks, registry ------------------===//
//
// What: the signature every memslim pass has, the cost policy knobs, the
// decision records (one per site: verdict, site, reason, price; rendered as
// `remark: <pass>: rewrote|kept ...`), and
// the explicit registry of passes and pipelines (a list, no static
// initialisers: the linker cannot drop a pass, and the order is visible).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memslim {

struct CostPolicy {
  int64_t min_bytes = 1;  // a rewrite must free at least this many bytes
  // Upper bound on a rewrite's extra work, in activation evaluations per element
  // (e.g. inverting GELU in backward costs about 2); negative: no bound.
  double max_added_work = -1;
  // Price sites of unknown shape as if they had this many fp32 elements
  // (0: keep them, the default).
  int64_t assume_numel = 0;
  // Bytes per element aten's dropout keeps for backward. Eager autograd keeps
  // the float noise (0 here means: the tensor's element size); TorchScript's
  // executor with optimisations on runs dropout as native_dropout and keeps a
  // bool mask (1). -1: decide from torch::jit::getGraphExecutorOptimize().
  int dropout_mask_bytes = -1;
};

// Resolves the policy's automatic settings against the current torch.jit state.
CostPolicy resolved(CostPolicy p);

// A policy value as a front end hands it over: memslim-opt's flag text (read
// as an integer, else a number, else left as text) or a Python object.
struct PolicyValue {
  enum class Kind { None, Bool, Int, Double, Text } kind = Kind::None;
  int64_t i = 0;
  double d = 0;
  static PolicyValue parse(const std::string& s);
};

// One CostPolicy option, declared once (passes/policy.cpp): memslim-opt's
// --kebab-name flag and memslim.optimize's snake_name keyword both read it.
struct PolicyOption {
  const char* name;       // "min_bytes"
  const char* value_help; // "N"
  const char* help;
  // Sets the option in `p` from `v`: "" or what it expects ("an integer in
  // [0, 1099511627776]"). None sets the default where the option has one
  // that is no value (max_added_work: no bound; dropout_mask_bytes: auto).
  std::string (*set)(CostPolicy& p, const PolicyValue& v);
  // The option's value in `p` (None for the "no value" defaults).
  PolicyValue (*get)(const CostPolicy& p);
  std::string flag() const; // "--min-bytes"
};
const std::vector<PolicyOption>& policy_options();
const PolicyOption* find_policy_option(const std::string& name); // name or flag
// "" or what is wrong with a CostPolicy set field by field (C++ callers):
// "min_bytes must be an integer in [0, ...], got -1", by the same table.
std::string policy_error(const CostPolicy& p);

// What a decision prices: the bytes the original and the rewrite keep for
// backward (the cost model's figures) and the rewrite's added work.
struct Price {
  std::optional<int64_t> before, after; // bytes kept for backward
  std::optional<double> added_work;     // activation evaluations per element
  std::optional<int64_t> freed() const {
    if (!before || !after) return std::nullopt;
    return *before - *after;
  }
};

// One decision of a pass at one site: the record every consumer reads
// (memslim-opt --remarks, memslim.report() and predicted_bytes_freed in
// Python, the executor hook's count); the remark line is rendered from it in
// one place, render().
struct Decision {
  enum class Verdict { Rewrote, Kept, RolledBack, Note };
  std::string pass;
  Verdict verdict = Verdict::Note;
  std::string site; // "aten::gelu at %h"; "" for a pass-level decision
  // Kept / RolledBack: the reason. Rewrote / Note: the pass's own sentence
  // (it names the site: "rewrote aten::gelu at %h: keeps ..., frees N B ...").
  std::string text;
  Price price;
  // `remark: <pass>: <kept <site>: reason | rolled back (...): reason | text>`
  std::string render() const;
};

const char* verdict_name(Decision::Verdict v); // "rewrote", "kept", ...

class Remarks {
 public:
  void add(Decision d) { decisions_.push_back(std::move(d)); }
  void kept(const std::string& pass, const std::string& site, const std::string& reason,
            Price price = {});
  // A line that is no decision about a site (test passes).
  void note(const std::string& pass, const std::string& text);
  const std::vector<Decision>& decisions() const { return decisions_; }
  size_t size() const { return decisions_.size(); }
  std::vector<std::string> lines() const; // rendered
  // Drops every decision after the first `n` (a rolled-back pass's remarks).
  void truncate(size_t n) {
    if (n < decisions_.size()) decisions_.resize(n);
  }

 private:
  std::vector<Decision> decisions_;
};

class SafetyGate;

struct PassContext {
  CostPolicy policy;
  Remarks remarks;
  // Set by run_pass while a pass runs: every rewrite goes through it.
  SafetyGate* gate = nullptr;
  // Tests and memslim-opt --verify: a pass that throws or leaves a graph that
  // does not lint is an error, not a silent rollback.
  bool strict = false;
};

using PassFn = void (*)(const std::shared_ptr<torch::jit::Graph>&, PassContext&);

struct PassInfo {
  const char* flag;         // kebab-case, = its lit file name
  const char* description;
  PassFn run;
};

struct PipelineInfo {
  const char* name;
  const char* description;
  std::vector<std::string> passes;
};

const std::vector<PassInfo>& registered_passes();
const std::vector<PipelineInfo>& registered_pipelines();
const PassInfo* find_pass(const std::string& flag);
const PipelineInfo* find_pipeline(const std::string& name);
// The passes to run: `passes` when given, else `pipeline`'s. Throws
// std::invalid_argument naming the unknown pass or pipeline.
std::vector<const PassInfo*> resolve_plan(const std::vector<std::string>& passes,
                                          const std::string& pipeline);

// Runs pass `p` on `g` as a transaction: through a SafetyGate (ctx.gate),
// linted afterwards; a pass that throws or breaks the graph is rolled back
// (graph restored, its remarks replaced by one `rolled back` remark) unless
// ctx.strict, where the error propagates.
void run_pass(const PassInfo& p, const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);

// Inserts `kind(inputs)` before `old` (one output, `old_output`'s type and
// metadata), redirects every use of `old_output` to it, and returns the new node.
// Shared by the rewriting passes; destroying `old` is left to the caller.
torch::jit::Node* replace_output(torch::jit::Graph& g, torch::jit::Node* old,
                                 torch::jit::Value* old_output, c10::Symbol kind,
                                 at::ArrayRef<torch::jit::Value*> inputs);

// Whether `n` sits in a prim::Loop body (the passes do not analyse loops).
bool inside_loop(const torch::jit::Node* n);

// What output-saving-activations would do at activation node `n`: bytes aten's
// op makes autograd keep beyond what others keep anyway, and the memslim op's.
// nullopt: not an activation, or unknown shape without policy.assume_numel.
struct OutputSavingPrice {
  int64_t aten = 0, ours = 0;
  std::string x_kept_by, y_kept_by;  // who else keeps input / output ("" nobody)
  bool assumed = false;              // priced with policy.assume_numel
  int64_t freed() const { return aten - ours; }
};
std::optional<OutputSavingPrice> output_saving_price(const torch::jit::Node* n,
                                                     const CostPolicy& policy);

// The passes (one file each).
void run_functionalize_inplace_activations(const std::shared_ptr<torch::jit::Graph>& g,
                                           PassContext& ctx);
void run_canonicalize_activations(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_fuse_activation_dropout(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_recompute_pointwise_regions(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_output_saving_activations(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_cleanup(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);
void run_test_perturb_outputs(const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx);

} // namespace memslim
