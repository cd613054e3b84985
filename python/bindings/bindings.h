//===- bindings.h - What the binding files of memslim._C share --------------===//
//
// What: the policy keywords as a CostPolicy (checked by passes/core/policy.cpp's
// table, ValueError naming the keyword), decision records as dicts (what
// python/memslim/records.py's Decision reads), a Python constant as the rules
// read constants, and the binders of fx_bindings.cpp and table_bindings.cpp.
// Why: memslim._C is one module built from three files by concern.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <torch/python.h>

#include <optional>
#include <vector>

#include "memslim/core/decision.h"

namespace memslim_py {
namespace py = pybind11;

memslim::CostPolicy policy_from_dict(const py::dict& policy);
py::list decision_dicts(const std::vector<memslim::Decision>& ds);
// None, bool, int, float, str and lists of ints or floats; nullopt: unknown.
std::optional<c10::IValue> constant_ivalue(py::handle o);

void bind_fx(py::module& m);     // fx_bindings.cpp
void bind_tables(py::module& m); // table_bindings.cpp
} // namespace memslim_py
