//===- decision.h - cost policy and decision records (front-end neutral) --===//
//
// What: the cost policy every decision reads (its options declared once, in
// passes/core/policy.cpp), the price of a rewrite, and the decision record one pass
// makes at one site; remark text is rendered from the record in one place.
// Why: both front ends (TorchScript passes, the FX adapter) produce and read
// these records; nothing here knows a graph IR.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memslim {

struct CostPolicy {
  int64_t min_bytes = 1; // a rewrite must free at least this many bytes
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
  // Coupling chains: every k-th block keeps its exact input (0: none), and a
  // block whose rebuilt input is off by more than the bound (relative) on the
  // first call keeps it too.
  int64_t coupling_anchor_every = 8;
  double coupling_drift_bound = 1e-5;
  // Keep at most this much of what the unmodified graph keeps for backward: a
  // fraction in (0, 1], or bytes (> 1); 0: no budget (passes/jit/memory_budget.cpp).
  double memory_budget = 0;
};

// A policy value as a front end hands it over: memslim-opt's flag text (read
// as an integer, else a number, else left as text) or a Python object.
struct PolicyValue {
  enum class Kind { None, Bool, Int, Double, Text } kind = Kind::None;
  int64_t i = 0;
  double d = 0;
  static PolicyValue parse(const std::string& s);
};

// One CostPolicy option, declared once (passes/core/policy.cpp): memslim-opt's
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
  // Kept by a safety gate: the name of the rule that refused the rewrite
  // (core/gate_rules.h: "write-after-guarded"); "" otherwise. Not in the
  // remark text.
  std::string rule;
  // `remark: <pass>: <kept <site>: reason | rolled back (...): reason | text>`
  std::string render() const;
};

const char* verdict_name(Decision::Verdict v); // "rewrote", "kept", ...

class Remarks {
 public:
  void add(Decision d) { decisions_.push_back(std::move(d)); }
  // `rule`: the gate rule that refused it, if a gate did (Decision::rule).
  void kept(const std::string& pass, const std::string& site, const std::string& reason,
            Price price = {}, const std::string& rule = "");
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

} // namespace memslim
