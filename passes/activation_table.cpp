//===- activation_table.cpp - aten vs memslim saved tensors per activation -===//
#include "memslim/passes/activation_table.h"

namespace memslim {

namespace {
struct Row { const char* name; Keeps aten; Keeps ours; };
// aten's column follows tools/autograd/derivatives.yaml: gelu, silu, mish,
// softplus, elu (and celu/selu, built on elu), leaky_relu, hardswish and
// hardsigmoid keep their input; sigmoid, tanh and relu keep their output.
constexpr Row kRows[] = {
    {"gelu", Keeps::Input, Keeps::OutputAndBits},
    {"silu", Keeps::Input, Keeps::OutputAndBits},
    {"mish", Keeps::Input, Keeps::OutputAndBits},
    {"hardswish", Keeps::Input, Keeps::OutputAndBits},
    {"softplus", Keeps::Input, Keeps::Output},
    {"elu", Keeps::Input, Keeps::Output},
    {"celu", Keeps::Input, Keeps::Output},
    {"selu", Keeps::Input, Keeps::Output},
    {"leaky_relu", Keeps::Input, Keeps::Bits},
    {"hardsigmoid", Keeps::Input, Keeps::Bits},
    {"relu", Keeps::Output, Keeps::Bits},
    {"sigmoid", Keeps::Output, Keeps::Output},
    {"tanh", Keeps::Output, Keeps::Output},
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
                        r.ours};
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
