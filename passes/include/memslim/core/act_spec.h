//===- act_spec.h - an aten activation call as a kernel activation ---------===//
//
// What: spec_for(op, args): the ActSpec (kernels/act_spec.h) of a public
// activation op called with these constant arguments, or nullopt when the
// arguments do not fit the op. Defined by the runtime library
// (runtime/activation_ops.cpp, over the op table), so that the core and the ops
// read an op's arguments one way and check them with the op's own errors; the
// core's users link the runtime (which registers the ops every rewrite names).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <vector>

#include "memslim/kernels/act_spec.h"

namespace memslim {

std::optional<ActSpec> spec_for(const std::string& op, const std::vector<c10::IValue>& args);

} // namespace memslim
