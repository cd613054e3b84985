//===- activation_spec.cpp - op arguments -> kernel activation + params ----===//
#include "memslim/activation_spec.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <string>

namespace memslim {

using kernels::Act;

namespace {
// params: how many the op takes, and their names for messages.
struct NameEntry {
  const char* name;
  Act act;
  size_t params;
  const char* param_names;
};
constexpr NameEntry kNames[] = {
#define MEMSLIM_ACT(ENUM, NAME, SAVE, NPARAMS, PARAM_NAMES) {NAME, Act::ENUM, NPARAMS, PARAM_NAMES},
#include "memslim/kernels/activation_table.def"
};
} // namespace

Act act_from_name(const std::string& act) {
  for (const auto& e : kNames)
    if (act == e.name) return e.act;
  TORCH_CHECK(false, "memslim: unknown activation '", act, "'");
}

void check_param_count(const char* op, const std::string& act, size_t n) {
  for (const auto& e : kNames)
    if (act == e.name) {
      TORCH_CHECK(n == e.params, "memslim::", op, ": '", act, "' takes ", e.params, " parameters (",
                  e.param_names, "), got ", n);
      return;
    }
  act_from_name(act); // unknown: its error
}

const char* act_name(Act a) {
  for (const auto& e : kNames)
    if (e.act == a) return e.name;
  return "?";
}

double guard_band(Act a, at::ScalarType t) {
  if (kernels::save_kind(a) != kernels::SaveKind::OutputBitsExact) return 0.0;
  // Half-widths chosen by measurement (bench/numerics_table.py, README table):
  // fp32: the fp32 input-gradient error stays <= 4.5e-5 of |grad_out| (bar:
  // 1e-4) while ~0.1% of N(0,1) inputs are kept. 16-bit: the smallest width
  // from {0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5} that keeps the error within
  // |x - x*| <= 0.8 under 4x aten's own 16-bit backward there (all values).
  // The flatter minima (silu, mish, hardswish) need wider bands because aten's
  // error there is small (f' is small, so its rounding is).
  const bool gelu = a == Act::Gelu || a == Act::GeluTanh;
  switch (t) {
    case at::kDouble:
      return 1e-6;
    case at::kFloat:
      return 2e-3;
    case at::kHalf:
      return gelu ? 0.1 : a == Act::Silu ? 0.4 : a == Act::Mish ? 0.4 : 0.5;
    case at::kBFloat16:
      return gelu ? 0.1 : a == Act::Silu ? 0.3 : a == Act::Mish ? 0.4 : 0.5;
    default:
      return 0.0;
  }
}

namespace {
// Largest finite value of a floating dtype (others: no overflow to consider).
double dtype_max(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return 65504.0;
    case at::kBFloat16:
      return 3.3895313892515355e38;
    case at::kFloat:
      return 3.4028234663852886e38;
    default:
      return 1.7976931348623157e308;
  }
}

// Where values start rounding to inf when stored in t (the midpoint above the
// largest finite value); inf where compute and storage share the format.
double rounds_to_inf_from(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return 65520.0;
    case at::kBFloat16:
      return 3.3961514220786001e38; // 0x7f7f8000
    default:
      return INFINITY;
  }
}

// params: the activation's (up to three), then optionally the factor the
// caller multiplies the output by before saving it (ActParams::out_scale).
kernels::ActParams params_for(Act a, const std::vector<double>& params, double out_max) {
  kernels::ActParams p;
  p.p0 = params.size() > 0 ? params[0] : 0.0;
  p.p1 = params.size() > 1 ? params[1] : 0.0;
  p.p2 = params.size() > 2 ? params[2] : 0.0;
  p.out_scale = params.size() > 3 ? params[3] : 1.0;
  p.bits = kernels::act_uses_bits(a, p.p0, p.p1, p.p2);
  p.keep_overflow = a == Act::Elu &&
                    kernels::elu_may_overflow(p.p0, p.p1, p.p2, out_max / std::fabs(p.out_scale));
  return p;
}
} // namespace

kernels::ActParams make_params(Act a, const std::vector<double>& params, at::ScalarType t) {
  kernels::ActParams p = params_for(a, params, dtype_max(t));
  p.band = guard_band(a, t);
  p.out_max = rounds_to_inf_from(t);
  return p;
}

bool act_keeps_bits(const std::string& act, const std::vector<double>& params) {
  return params_for(act_from_name(act), params, 0.0).bits;
}

bool act_keeps_exact_list(const std::string& act, const std::vector<double>& params,
                          double out_max) {
  const Act a = act_from_name(act);
  return kernels::act_has_exact_list(a, params_for(a, params, out_max));
}

bool act_keeps_exact_list(const std::string& act, const std::vector<double>& params,
                          at::ScalarType t) {
  return act_keeps_exact_list(act, params, dtype_max(t));
}

void check_dtype(const at::Tensor& x, const std::string& op) {
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
              "memslim::", op,
              ": expected a floating-point tensor (float, double, half or "
              "bfloat16), got ",
              t);
}

ActSpec spec_gelu(c10::string_view approximate) {
  if (approximate == "none") return {"gelu", "gelu", {}};
  if (approximate == "tanh") return {"gelu", "gelu_tanh", {}};
  TORCH_CHECK(false, "memslim::gelu: approximate argument must be either none or tanh, got '",
              std::string(approximate), "'");
}

ActSpec spec_softplus(const c10::Scalar& beta, const c10::Scalar& threshold) {
  return {"softplus", "softplus", {beta.toDouble(), threshold.toDouble()}};
}

ActSpec spec_elu(const c10::Scalar& alpha, const c10::Scalar& scale,
                 const c10::Scalar& input_scale) {
  return {"elu", "elu", {alpha.toDouble(), scale.toDouble(), input_scale.toDouble()}};
}

ActSpec spec_celu(const c10::Scalar& alpha) {
  const double a = alpha.toDouble();
  TORCH_CHECK(a != 0.0, "memslim::celu: ZeroDivisionError (alpha must not be 0)");
  return {"celu", "elu", {a, 1.0, 1.0 / a}};
}

ActSpec spec_selu() {
  return {
      "selu", "elu", {1.6732632423543772848170429916717, 1.0507009873554804934193349852946, 1.0}};
}

ActSpec spec_leaky_relu(const c10::Scalar& negative_slope) {
  return {"leaky_relu", "leaky_relu", {negative_slope.toDouble()}};
}

ActSpec spec_simple(const std::string& name) { return {name, name, {}}; }

// The table for Python (memslim.activation_table()): one JSON document built
// once from activation_table.def, so Python lists no activation of its own.
extern "C" const char* memslim_activation_table_json() {
  static const std::string json = [] {
    std::string s = "{\"kernels\": [";
    const char* sep = "";
    auto num = [](double v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", v);
      return std::string(buf);
    };
#define MEMSLIM_ACT(ENUM, NAME, SAVE, NPARAMS, PARAM_NAMES)                                  \
  s += std::string(sep) + "{\"name\": \"" NAME "\", \"save\": \"" #SAVE "\", \"params\": " + \
       std::to_string(NPARAMS) + ", \"param_names\": \"" PARAM_NAMES "\", \"x_min\": " +     \
       (kernels::SaveKind::SAVE == kernels::SaveKind::OutputBitsExact                        \
            ? num(kernels::detail::min_info<kernels::Act::ENUM>().x)                         \
            : std::string("null")) +                                                         \
       "}";                                                                                  \
  sep = ", ";
#include "memslim/kernels/activation_table.def"
    s += "], \"ops\": [";
    sep = "";
#define MEMSLIM_OP(NAME, ENUM, ARGS, ATEN_KEEPS, INPLACE_KEEPS, WORK)                  \
  s += std::string(sep) + "{\"name\": \"" #NAME "\", \"kernel\": \"" +                 \
       act_name(kernels::Act::ENUM) +                                                  \
       "\", \"aten_keeps\": \"" #ATEN_KEEPS "\", \"inplace_keeps\": \"" #INPLACE_KEEPS \
       "\", \"added_work\": " +                                                        \
       num(WORK) + "}";                                                                \
  sep = ", ";
#include "memslim/kernels/activation_table.def"
    return s + "]}";
  }();
  return json.c_str();
}

} // namespace memslim
