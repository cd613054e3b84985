//===- activation_table.cpp - aten vs memslim saved tensors per activation -===//
#include "memslim/passes/activation_table.h"

#include "memslim/activation_spec.h"
#include "memslim/kernels/activations.h"

namespace memslim {

namespace {
struct Row { const char* name; Keeps aten; double work; Keeps inplace; };
// Last column: extra work per element, from the measured fwd+bwd ratios to
// aten (bench/results/op_speed.md: gelu 2.3x, silu 2.3x, mish 1.4x, hardswish
// 1.5x, the rest <= 1.2x), in units of one activation evaluation.
// aten's column follows tools/autograd/derivatives.yaml: gelu, silu, mish,
// softplus, elu (and celu/selu, built on elu), leaky_relu, hardswish and
// hardsigmoid keep their input; sigmoid, tanh and relu keep their output.
// The in-place forms of relu, leaky_relu, elu, celu, selu, sigmoid and tanh
// keep their output (derivatives.yaml's `result` formulas); gelu_, silu_,
// mish_, hardswish_ and hardsigmoid_ keep a copy of their input (measured:
// saved_tensors_hooks sees a third tensor, neither input nor output).
// memslim's column is not repeated here: it is the kernels' own save_kind.
constexpr Row kRows[] = {
    {"gelu", Keeps::Input, 2.0, Keeps::Input},
    {"silu", Keeps::Input, 2.0, Keeps::Input},
    {"mish", Keeps::Input, 1.0, Keeps::Input},
    {"hardswish", Keeps::Input, 0.5, Keeps::Input},
    {"softplus", Keeps::Input, 0.2, Keeps::Input},
    {"elu", Keeps::Input, 0.0, Keeps::Output},
    {"celu", Keeps::Input, 0.0, Keeps::Output},
    {"selu", Keeps::Input, 0.0, Keeps::Output},
    {"leaky_relu", Keeps::Input, 0.2, Keeps::Output},
    {"hardsigmoid", Keeps::Input, 0.2, Keeps::Input},
    {"relu", Keeps::Output, 0.2, Keeps::Output},
    {"sigmoid", Keeps::Output, 0.1, Keeps::Output},
    {"tanh", Keeps::Output, 0.2, Keeps::Output},
};
// What the memslim op keeps, from the kernel it runs (celu and selu run elu).
Keeps memslim_keeps(const std::string& name) {
  const std::string act = (name == "celu" || name == "selu") ? "elu" : name;
  switch (kernels::save_kind(act_from_name(act))) {
  case kernels::SaveKind::OutputBitsExact: return Keeps::OutputAndBits;
  case kernels::SaveKind::Mask: return Keeps::Bits;
  case kernels::SaveKind::Output: return Keeps::Output;
  }
  return Keeps::Output;
}
} // namespace

std::optional<ActivationInfo> activation_info(c10::Symbol kind) {
  if (!kind.is_aten() && kind.ns() != c10::Symbol::fromQualString("namespaces::memslim"))
    return std::nullopt;
  const std::string name = kind.toUnqualString();
  for (const Row& r : kRows) {
    if (name != r.name) continue;
    ActivationInfo info{c10::Symbol::fromQualString(std::string("aten::") + r.name),
                        c10::Symbol::fromQualString(std::string("memslim::") + r.name), r.aten,
                        memslim_keeps(r.name), r.inplace, r.work};
    if (kind == info.aten || kind == info.memslim) return info;
  }
  return std::nullopt;
}

const char* keeps_name(Keeps k) {
  switch (k) {
  case Keeps::Input: return "input";
  case Keeps::Output: return "output";
  case Keeps::OutputAndBits: return "output + bits";
  case Keeps::Bits: return "bits";
  }
  return "?";
}

} // namespace memslim
