//===- norm_table.cpp - aten vs memslim norms, from norm_table.def --------===//
#include "memslim/core/norm_table.h"

#include <string>

namespace memslim {

namespace {
struct Row {
  const char* name;
  int weight, bias, extra;
  double work;
};
constexpr Row kRows[] = {
#define MEMSLIM_NORM(NAME, ARGS, WEIGHT_ARG, BIAS_ARG, ATEN_EXTRA, WORK) \
  {#NAME, WEIGHT_ARG, BIAS_ARG, ATEN_EXTRA, WORK},
#include "memslim/kernels/norm_table.def"
};
} // namespace

std::optional<NormInfo> norm_info(c10::Symbol kind) {
  if (!kind.is_aten() && kind.ns() != c10::Symbol::fromQualString("namespaces::memslim"))
    return std::nullopt;
  const std::string name = kind.toUnqualString();
  for (const Row& r : kRows) {
    if (name != r.name) continue;
    return NormInfo{c10::Symbol::fromQualString(std::string("aten::") + r.name),
                    c10::Symbol::fromQualString(std::string("memslim::") + r.name),
                    r.weight,
                    r.bias,
                    r.extra,
                    r.work};
  }
  return std::nullopt;
}

} // namespace memslim
