//===- activation_table.cpp - aten vs memslim saved tensors per activation -===//
#include "memslim/passes/activation_table.h"

namespace memslim {

namespace {
struct Row { const char* name; Keeps aten; Keeps ours; double work; };
// Last column: extra work per element, from the measured fwd+bwd ratios to
// aten (bench/results/op_speed.md: gelu 2.3x, silu 2.3x, mish 1.4x, hardswish
// 1.5x, the rest <= 1.2x), in units of one activation evaluation.
// aten's column follows tools/autograd/derivatives.yaml: gelu, silu, mish,
// softplus, elu (and celu/selu, built on elu), leaky_relu, hardswish and
// hardsigmoid keep their input; sigmoid, tanh and relu keep their output.
constexpr Row kRows[] = {
    {"gelu", Keeps::Input, Keeps::OutputAndBits, 2.0},
    {"silu", Keeps::Input, Keeps::OutputAndBits, 2.0},
    {"mish", Keeps::Input, Keeps::OutputAndBits, 1.0},
    {"hardswish", Keeps::Input, Keeps::OutputAndBits, 0.5},
    {"softplus", Keeps::Input, Keeps::Output, 0.2},
    {"elu", Keeps::Input, Keeps::Output, 0.0},
    {"celu", Keeps::Input, Keeps::Output, 0.0},
    {"selu", Keeps::Input, Keeps::Output, 0.0},
    {"leaky_relu", Keeps::Input, Keeps::Bits, 0.2},
    {"hardsigmoid", Keeps::Input, Keeps::Bits, 0.2},
    {"relu", Keeps::Output, Keeps::Bits, 0.2},
    {"sigmoid", Keeps::Output, Keeps::Output, 0.1},
    {"tanh", Keeps::Output, Keeps::Output, 0.2},
};
} // namespace

std::optional<ActivationInfo> activation_info(c10::Symbol kind) {
  if (!kind.is_aten() && kind.ns() != c10::Symbol::fromQualString("namespaces::memslim"))
    return std::nullopt;
  const std::string name = kind.toUnqualString();
  for (const Row& r : kRows) {
    if (name != r.name) continue;
    ActivationInfo info{c10::Symbol::fromQualString(std::string("aten::") + r.name),
                        c10::Symbol::fromQualString(std::string("memslim::") + r.name), r.aten,
                        r.ours, r.work};
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
