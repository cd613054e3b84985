//===- inputs.cpp - example inputs for the recording run and --verify -----===//
//
// What: TensorSpec (sizes, strides, dtype, device) from a token or a type;
// the memory check (all example tensors within a quarter of this machine's
// memory) before anything is allocated; random values, seeded, so that two
// runs of the tool see the same inputs.
// Why the check: a shape typo (1000000x1000000) is one error line, not the
// allocator's abort.
//
//===----------------------------------------------------------------------===//
#include "inputs.h"

#include <torch/script.h>
#include <unistd.h>

#include <cstdint>
#include <limits>

#include "options.h"
#include "support.h"

namespace memslim_opt {

using torch::jit::Graph;
using torch::jit::Value;

namespace {

struct TensorSpec {
  std::vector<int64_t> sizes;
  std::optional<std::vector<int64_t>> strides;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
};

size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : size_t(1) << 34;
}

// Bytes the tensor's storage needs (nullopt on overflow).
std::optional<uint64_t> storage_bytes(const TensorSpec& s) {
  uint64_t n = 1;
  for (size_t i = 0; i < s.sizes.size(); ++i) {
    if (s.sizes[i] < 0) return std::nullopt;
    if (s.sizes[i] == 0) return 0;
  }
  if (s.strides) {
    uint64_t last = 0;
    for (size_t i = 0; i < s.sizes.size(); ++i) {
      const uint64_t st = uint64_t((*s.strides)[i]), sz = uint64_t(s.sizes[i] - 1);
      if (st != 0 && sz > (std::numeric_limits<uint64_t>::max() >> 2) / st) return std::nullopt;
      last += sz * st;
      if (last > (std::numeric_limits<uint64_t>::max() >> 2)) return std::nullopt;
    }
    n = last + 1;
  } else {
    for (int64_t d : s.sizes) {
      if (uint64_t(d) > (std::numeric_limits<uint64_t>::max() >> 2) / n) return std::nullopt;
      n *= uint64_t(d);
    }
  }
  const uint64_t el = c10::elementSize(s.dtype);
  if (n > (std::numeric_limits<uint64_t>::max() >> 2) / el) return std::nullopt;
  return n * el;
}

at::Tensor make_tensor(const TensorSpec& s) {
  auto opts = at::TensorOptions().dtype(s.dtype).device(s.device);
  int64_t storage = 1;
  for (int64_t d : s.sizes) storage = d == 0 ? 0 : storage;
  if (s.strides && storage != 0) {
    storage = 1;
    for (size_t i = 0; i < s.sizes.size(); ++i) storage += (s.sizes[i] - 1) * (*s.strides)[i];
  } else if (storage != 0) {
    storage = 1;
    for (int64_t d : s.sizes) storage *= d;
  }
  at::Tensor base;
  if (at::isFloatingType(s.dtype) || at::isComplexType(s.dtype))
    base = at::randn({storage}, opts);
  else if (s.dtype == at::kBool)
    base = at::randint(0, 2, {storage}, opts.dtype(at::kLong)).to(at::kBool);
  else
    base = at::randint(0, 2, {storage}, opts);
  if (s.strides) return base.as_strided(s.sizes, *s.strides);
  return base.view(s.sizes);
}

// Checks the example tensors fit in memory, then makes them (seeded).
Example materialise(const std::vector<std::optional<TensorSpec>>& tensors,
                    const std::vector<c10::IValue>& others, const std::vector<bool>& grads,
                    const std::string& what) {
  uint64_t total = 0;
  for (const auto& t : tensors) {
    if (!t) continue;
    auto b = storage_bytes(*t);
    if (!b || *b > physical_memory() / 4 || total + *b > physical_memory() / 4)
      fail(what + ": the example inputs need more than a quarter of this machine's memory (" +
           std::to_string(physical_memory() >> 20) + " MiB)");
    total += *b;
  }
  at::manual_seed(0);
  Example ex;
  for (size_t i = 0; i < tensors.size(); ++i) {
    try {
      ex.values.push_back(tensors[i] ? c10::IValue(make_tensor(*tensors[i])) : others[i]);
    } catch (const std::exception& e) {
      fail(what + ": cannot make example input " + std::to_string(i + 1) + ": " + one_line(e));
    }
    ex.requires_grad.push_back(
        tensors[i] && grads[i] &&
        (at::isFloatingType(tensors[i]->dtype) || at::isComplexType(tensors[i]->dtype)));
  }
  return ex;
}

} // namespace

std::string describe(const Value* v) {
  return "%" + v->debugName() + " : " + v->type()->repr_str();
}

// Reads --input-shapes tokens against the declared types of the inputs.
Example inputs_from_specs(const std::vector<c10::TypePtr>& types,
                          const std::vector<std::string>& names,
                          const std::vector<std::string>& specs) {
  if (types.size() != specs.size())
    fail("--input-shapes: the graph takes " + std::to_string(types.size()) + " inputs, got " +
         std::to_string(specs.size()));
  std::vector<std::optional<TensorSpec>> tensors(types.size());
  std::vector<c10::IValue> others(types.size());
  std::vector<bool> grads(types.size(), true);
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string& tok = specs[i];
    const std::string who = "--input-shapes: input " + names[i] + " (" + types[i]->repr_str() + ")";
    c10::TypePtr t = types[i];
    if (auto opt = t->cast<c10::OptionalType>()) {
      if (tok == "none") continue; // others[i] is None
      t = opt->getElementType();
    }
    if (auto tt = t->cast<c10::TensorType>()) {
      if (!is_shape_token(tok)) fail(who + " takes a shape like 4x3, got '" + tok + "'");
      TensorSpec s;
      if (tok != "scalar")
        for (const auto& d : split(tok, 'x')) s.sizes.push_back(std::stoll(d));
      if (tt->scalarType()) s.dtype = *tt->scalarType();
      if (tt->device()) s.device = *tt->device();
      if (tt->requiresGrad()) grads[i] = *tt->requiresGrad();
      tensors[i] = s;
    } else if (t->kind() == c10::TypeKind::BoolType) {
      if (tok == "true" || tok == "1")
        others[i] = true;
      else if (tok == "false" || tok == "0")
        others[i] = false;
      else
        fail(who + " takes true or false, got '" + tok + "'");
    } else if (t->kind() == c10::TypeKind::IntType) {
      long long v = 0;
      if (!parse_int(tok, v)) fail(who + " takes an integer, got '" + tok + "'");
      others[i] = int64_t(v);
    } else if (t->kind() == c10::TypeKind::FloatType || t->kind() == c10::TypeKind::NumberType) {
      double v = 0;
      if (!parse_double(tok, v)) fail(who + " takes a number, got '" + tok + "'");
      others[i] = v;
    } else if (t->kind() == c10::TypeKind::NoneType) {
      if (tok != "none") fail(who + " takes none, got '" + tok + "'");
    } else {
      fail(who + " cannot be given on the command line");
    }
  }
  return materialise(tensors, others, grads, "--input-shapes");
}

// Complete tensor types in the signature as example inputs; nullopt (and why)
// when some input has none.
std::optional<Example> inputs_from_types(const std::shared_ptr<Graph>& g, std::string& why) {
  std::vector<std::optional<TensorSpec>> tensors;
  std::vector<bool> grads;
  for (const Value* v : g->inputs()) {
    auto tt = v->type()->cast<c10::TensorType>();
    auto sizes = tt ? tt->sizes().concrete_sizes() : std::nullopt;
    if (!tt || !sizes || !tt->scalarType() || !tt->device()) {
      why = describe(v);
      return std::nullopt;
    }
    TensorSpec s;
    s.sizes = *sizes;
    s.dtype = *tt->scalarType();
    s.device = *tt->device();
    if (auto st = tt->strides().concrete_sizes()) {
      for (int64_t x : *st)
        if (x < 0) fail("input " + describe(v) + ": negative strides are not supported");
      s.strides = *st;
    }
    if (c10::isQIntType(s.dtype) || s.dtype == at::kComplexHalf)
      fail("input " + describe(v) + ": no example values for this dtype");
    tensors.push_back(s);
    grads.push_back(tt->requiresGrad().value_or(true));
  }
  return materialise(tensors, std::vector<c10::IValue>(tensors.size()), grads, "signature types");
}

// The example in float64 (floating tensors converted; the rest as is).
Example in_double(const Example& ex) {
  Example d = ex;
  for (auto& v : d.values)
    if (v.isTensor() && at::isFloatingType(v.toTensor().scalar_type()))
      v = v.toTensor().to(at::kDouble);
  return d;
}

} // namespace memslim_opt
