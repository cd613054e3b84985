//===- activation_table.cpp - aten vs memslim saved tensors per activation -===//
#include "memslim/core/activation_table.h"

#include "memslim/kernels/activations.h"

namespace memslim {

namespace {
// activation_table.def's public ops: what aten keeps and the added work.
// memslim's column is not repeated: it is the kernel's own save_kind.
struct Row {
  const char* name;
  kernels::Act act;
  Keeps aten;
  Keeps inplace;
  double work;
};
constexpr Row kRows[] = {
#define MEMSLIM_OP(NAME, ENUM, ARGS, ATEN_KEEPS, INPLACE_KEEPS, WORK) \
  {#NAME, kernels::Act::ENUM, Keeps::ATEN_KEEPS, Keeps::INPLACE_KEEPS, WORK},
#include "memslim/kernels/activation_table.def"
};
Keeps memslim_keeps(kernels::Act a) {
  switch (kernels::save_kind(a)) {
    case kernels::SaveKind::OutputBitsExact:
      return Keeps::OutputAndBits;
    case kernels::SaveKind::Mask:
      return Keeps::Bits;
    case kernels::SaveKind::Output:
      return Keeps::Output;
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
                        c10::Symbol::fromQualString(std::string("memslim::") + r.name),
                        r.aten,
                        memslim_keeps(r.act),
                        r.inplace,
                        r.work};
    if (kind == info.aten || kind == info.memslim) return info;
  }
  return std::nullopt;
}

const char* keeps_name(Keeps k) {
  switch (k) {
    case Keeps::Input:
      return "input";
    case Keeps::Output:
      return "output";
    case Keeps::OutputAndBits:
      return "output + bits";
    case Keeps::Bits:
      return "bits";
  }
  return "?";
}

} // namespace memslim
