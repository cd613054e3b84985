//===- policy.cpp - the cost policy's options, declared once ---------------===//
//
// What: every CostPolicy option with its name, help and validation, in one
// table that each front end reads: memslim-opt turns it into --kebab-name
// flags and its usage text, the Python binding into memslim.optimize's
// keyword checks. Why: a knob used to be declared in four files (the struct,
// memslim-opt's parser, Python's validator, the binding's argument list), each
// with its own ranges.
//
//===----------------------------------------------------------------------===//
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "memslim/core/decision.h"

namespace memslim {

PolicyValue PolicyValue::parse(const std::string& s) {
  PolicyValue v;
  v.kind = Kind::Text;
  if (s.empty()) return v;
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (errno == 0 && *end == '\0') {
    v.kind = Kind::Int;
    v.i = i;
    return v;
  }
  const double d = std::strtod(s.c_str(), &end);
  if (*end == '\0') {
    v.kind = Kind::Double;
    v.d = d;
  }
  return v;
}

namespace {

constexpr int64_t kMaxNumel = int64_t(1) << 40;

// An integer in [0, max]: an int, or a float with an integer value.
std::optional<int64_t> as_int(const PolicyValue& v, int64_t max) {
  if (v.kind == PolicyValue::Kind::Int && v.i >= 0 && v.i <= max) return v.i;
  if (v.kind == PolicyValue::Kind::Double && std::isfinite(v.d) && v.d == std::floor(v.d) &&
      v.d >= 0 && v.d <= static_cast<double>(max))
    return static_cast<int64_t>(v.d);
  return std::nullopt;
}

// A number: an int or a float (None and text: none).
std::optional<double> as_number(const PolicyValue& v) {
  if (v.kind == PolicyValue::Kind::Int) return static_cast<double>(v.i);
  if (v.kind == PolicyValue::Kind::Double) return v.d;
  return std::nullopt;
}

std::string int_range(int64_t max) { return "an integer in [0, " + std::to_string(max) + "]"; }

std::string set_min_bytes(CostPolicy& p, const PolicyValue& v) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  auto i = as_int(v, max);
  if (!i) return int_range(max);
  p.min_bytes = *i;
  return "";
}

std::string set_max_added_work(CostPolicy& p, const PolicyValue& v) {
  const char* expect = "a number >= 0";
  if (v.kind == PolicyValue::Kind::None) {
    p.max_added_work = -1; // no bound
    return "";
  }
  const auto d = as_number(v);
  if (!d || std::isnan(*d) || *d < 0) return expect;
  p.max_added_work = *d;
  return "";
}

std::string set_assume_numel(CostPolicy& p, const PolicyValue& v) {
  auto i = as_int(v, kMaxNumel);
  if (!i) return int_range(kMaxNumel);
  p.assume_numel = *i;
  return "";
}

std::string set_dropout_mask_bytes(CostPolicy& p, const PolicyValue& v) {
  if (v.kind == PolicyValue::Kind::None) {
    p.dropout_mask_bytes = -1; // from torch.jit's executor state
    return "";
  }
  auto i = as_int(v, 1);
  if (!i) return "0 or 1";
  p.dropout_mask_bytes = static_cast<int>(*i);
  return "";
}

std::string set_coupling_anchor_every(CostPolicy& p, const PolicyValue& v) {
  auto i = as_int(v, 1 << 20);
  if (!i) return int_range(1 << 20);
  p.coupling_anchor_every = *i;
  return "";
}

std::string set_coupling_drift_bound(CostPolicy& p, const PolicyValue& v) {
  const char* expect = "a number in (0, 1]";
  const auto d = as_number(v);
  if (!d || !(*d > 0 && *d <= 1)) return expect;
  p.coupling_drift_bound = *d;
  return "";
}

std::string set_memory_budget(CostPolicy& p, const PolicyValue& v) {
  const char* expect = "a fraction in (0, 1] or a whole number of bytes > 1 (None: no budget)";
  if (v.kind == PolicyValue::Kind::None) {
    p.memory_budget = 0;
    return "";
  }
  const auto d = as_number(v);
  if (!d || !std::isfinite(*d) || *d <= 0 || (*d > 1 && *d != std::floor(*d))) return expect;
  p.memory_budget = *d;
  return "";
}

PolicyValue int_value(int64_t i) {
  PolicyValue v;
  v.kind = PolicyValue::Kind::Int;
  v.i = i;
  return v;
}

PolicyValue get_min_bytes(const CostPolicy& p) { return int_value(p.min_bytes); }
PolicyValue get_assume_numel(const CostPolicy& p) { return int_value(p.assume_numel); }
PolicyValue get_max_added_work(const CostPolicy& p) {
  PolicyValue v;
  if (p.max_added_work == -1) return v; // None: no bound
  v.kind = PolicyValue::Kind::Double;
  v.d = p.max_added_work;
  return v;
}
PolicyValue get_coupling_anchor_every(const CostPolicy& p) {
  return int_value(p.coupling_anchor_every);
}
PolicyValue get_coupling_drift_bound(const CostPolicy& p) {
  PolicyValue v;
  v.kind = PolicyValue::Kind::Double;
  v.d = p.coupling_drift_bound;
  return v;
}
PolicyValue get_memory_budget(const CostPolicy& p) {
  PolicyValue v;
  if (p.memory_budget == 0) return v; // None: no budget
  v.kind = PolicyValue::Kind::Double;
  v.d = p.memory_budget;
  return v;
}
PolicyValue get_dropout_mask_bytes(const CostPolicy& p) {
  return p.dropout_mask_bytes == -1 ? PolicyValue{} : int_value(p.dropout_mask_bytes);
}

} // namespace

std::string policy_error(const CostPolicy& p) {
  for (const PolicyOption& o : policy_options()) {
    const PolicyValue v = o.get(p);
    CostPolicy scratch;
    const std::string why = o.set(scratch, v);
    if (!why.empty())
      return std::string(o.name) + " must be " + why + ", got " +
             (v.kind == PolicyValue::Kind::Double ? std::to_string(v.d) : std::to_string(v.i));
  }
  return "";
}

const std::vector<PolicyOption>& policy_options() {
  static const std::vector<PolicyOption> options = {
      {"min_bytes", "N", "a rewrite must free at least N bytes (default 1)", set_min_bytes,
       get_min_bytes},
      {"max_added_work", "W",
       "the most extra work a rewrite may add, in activation evaluations per element (inverting "
       "GELU/SiLU ~2, Mish ~1, the rest <= 0.5; default: no bound)",
       set_max_added_work, get_max_added_work},
      {"assume_numel", "N",
       "price sites of unknown shape as if they had N fp32 elements instead of keeping them "
       "(default 0: keep them)",
       set_assume_numel, get_assume_numel},
      {"dropout_mask_bytes", "0|1",
       "what aten's dropout keeps per element: 0, eager autograd's float noise; 1, the bool "
       "mask TorchScript's optimising executor keeps (default: 1 when it optimises; 0 in the "
       "FX front end)",
       set_dropout_mask_bytes, get_dropout_mask_bytes},
      {"coupling_anchor_every", "K",
       "in a coupling chain every K-th block keeps its exact input, bounding drift (0: none; "
       "default 8)",
       set_coupling_anchor_every, get_coupling_anchor_every},
      {"coupling_drift_bound", "E",
       "a coupling block whose input, rebuilt from its outputs on the first call, is off by more "
       "than E (relative, max norm) keeps its exact input (default 1e-5)",
       set_coupling_drift_bound, get_coupling_drift_bound},
      {"memory_budget", "B",
       "keep at most B of the unmodified model's saved-for-backward bytes (a fraction in (0, 1]) "
       "or B bytes (> 1): the pipeline's rewrites first, then whole blocks recomputed in "
       "backward, chosen by bytes freed per added work without raising the backward's peak; "
       "an unreachable budget is an error naming the smallest reachable figure (default: none)",
       set_memory_budget, get_memory_budget},
  };
  return options;
}

std::string PolicyOption::flag() const {
  std::string f = std::string("--") + name;
  for (char& c : f)
    if (c == '_') c = '-';
  return f;
}

const PolicyOption* find_policy_option(const std::string& name) {
  for (const PolicyOption& o : policy_options())
    if (name == o.name || name == o.flag()) return &o;
  return nullptr;
}

} // namespace memslim
