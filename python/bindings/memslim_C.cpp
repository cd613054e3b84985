//===- memslim_C.cpp - Python bindings of the pass library -----------------===//
//
// What: the module memslim._C: memslim._C.optimize(script_module._c, ...) ->
// (cloned module, decision records as dicts), the executor hook and the
// activation facts the fake kernels read; the FX front end's typed boundary is
// in fx_bindings.cpp, the pass and policy tables in table_bindings.cpp. The
// helpers all three share (policy dicts, decision dicts, constants) are
// declared in bindings.h. torch's pybind11 casters take torch._C objects
// (ScriptModule, Tensor) directly.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/python.h>

#include "bindings.h"
#include "memslim/activation_spec.h"
#include "memslim/core/pass_table.h"
#include "memslim/core/statistics.h"
#include "memslim/fx/fx_front_end.h"
#include "memslim/jit/executor_hook.h"
#include "memslim/jit/optimize.h"
#include "memslim/kernels/activations.h"

namespace py = pybind11;

namespace memslim_py {
// Policy keywords, checked by passes/core/policy.cpp's table as memslim-opt's flags
// are: ValueError naming the keyword and what it expects.
memslim::CostPolicy policy_from_dict(const py::dict& policy) {
  memslim::CostPolicy p;
  for (const auto& [key, value] : policy) {
    const std::string name = py::cast<std::string>(key);
    const memslim::PolicyOption* po = memslim::find_policy_option(name);
    if (!po || name != po->name)
      throw py::value_error("memslim.optimize: unknown policy option '" + name + "'");
    memslim::PolicyValue v;
    using K = memslim::PolicyValue::Kind;
    if (value.is_none()) {
      v.kind = K::None;
    } else if (py::isinstance<py::bool_>(value)) {
      v.kind = K::Bool;
    } else if (py::isinstance<py::int_>(value)) {
      // Python ints are unbounded: one beyond int64 is out of every range.
      try {
        v.i = py::cast<int64_t>(value);
        v.kind = K::Int;
      } catch (const py::cast_error&) {
        v.kind = K::Text;
      }
    } else if (py::isinstance<py::float_>(value)) {
      v.kind = K::Double;
      v.d = py::cast<double>(value);
    } else {
      v.kind = K::Text;
    }
    const std::string why = po->set(p, v);
    if (!why.empty())
      throw py::value_error("memslim.optimize: " + name + " must be " + why + ", got " +
                            py::cast<std::string>(py::repr(value)));
  }
  return p;
}
// A Python constant of an FX node's arguments as the rules read constants:
// None, bool, int, float, str and lists of ints or floats; others unknown.
std::optional<c10::IValue> constant_ivalue(py::handle o) {
  if (o.is_none()) return c10::IValue();
  if (py::isinstance<py::bool_>(o)) return c10::IValue(py::cast<bool>(o));
  if (py::isinstance<py::int_>(o)) {
    try {
      return c10::IValue(py::cast<int64_t>(o));
    } catch (const py::cast_error&) {
      return std::nullopt;
    }
  }
  if (py::isinstance<py::float_>(o)) return c10::IValue(py::cast<double>(o));
  if (py::isinstance<py::str>(o)) return c10::IValue(py::cast<std::string>(o));
  if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    const auto seq = py::reinterpret_borrow<py::sequence>(o);
    bool ints = true, nums = true;
    for (const auto& e : seq) {
      ints = ints && py::isinstance<py::int_>(e) && !py::isinstance<py::bool_>(e);
      nums = nums && (py::isinstance<py::int_>(e) || py::isinstance<py::float_>(e));
    }
    try {
      if (ints) return c10::IValue(py::cast<std::vector<int64_t>>(seq));
      if (nums) return c10::IValue(py::cast<std::vector<double>>(seq));
    } catch (const py::cast_error&) {
    }
  }
  return std::nullopt;
}

// One dict per decision record (python/memslim/optimize.py wraps them).
py::list decision_dicts(const std::vector<memslim::Decision>& ds) {
  py::list decisions;
  for (const memslim::Decision& d : ds) {
    py::dict rec;
    rec["pass"] = d.pass;
    rec["verdict"] = memslim::verdict_name(d.verdict);
    rec["site"] = d.site;
    rec["text"] = d.text;
    rec["line"] = d.render();
    rec["bytes_before"] = d.price.before ? py::cast(*d.price.before) : py::none();
    rec["bytes_after"] = d.price.after ? py::cast(*d.price.after) : py::none();
    rec["added_work"] = d.price.added_work ? py::cast(*d.price.added_work) : py::none();
    // The safety gate's rule that refused the rewrite (core/gate_rules.h), or None.
    rec["rule"] = d.rule.empty() ? py::none() : py::cast(d.rule);
    decisions.append(rec);
  }
  return decisions;
}
} // namespace memslim_py

using namespace memslim_py;

PYBIND11_MODULE(_C, m) {
  m.doc() = "memslim pass library";
  m.def(
      "optimize",
      [](const torch::jit::Module& module, const std::vector<std::string>& methods,
         const std::vector<std::string>& passes, const std::string& pipeline,
         const py::tuple& example_args, const py::dict& example_kwargs, const py::dict& policy) {
        memslim::OptimizeOptions o;
        o.methods = methods;
        o.passes = passes;
        o.pipeline = pipeline;
        o.policy = policy_from_dict(policy);
        if (!example_args.empty() || !example_kwargs.empty()) {
          // Python values -> IValues by forward's argument types, as a call
          // of the scripted forward would convert them.
          auto forward = module.find_method("forward");
          if (!forward)
            throw std::runtime_error("memslim.optimize: the module has no forward method");
          const auto& schema = forward->function().getSchema();
          const auto& args = schema.arguments();
          const size_t want = args.size() - 1;
          if (example_args.size() > want)
            throw std::runtime_error("memslim.optimize: forward takes " + std::to_string(want) +
                                     " inputs, got " + std::to_string(example_args.size()) +
                                     " example inputs");
          auto convert = [&](size_t i, py::handle obj) {
            try {
              return torch::jit::argumentToIValue(schema, i, obj);
            } catch (const std::exception&) {
              throw py::type_error("memslim.optimize: forward's argument '" + args[i].name() +
                                   "' takes " + args[i].type()->repr_str() + ", got " +
                                   std::string(py::str(py::type::of(obj).attr("__name__"))) + " (" +
                                   std::string(py::repr(obj)).substr(0, 80) + ")");
            }
          };
          for (size_t i = 0; i < example_args.size(); ++i)
            o.example_inputs.push_back(convert(i + 1, example_args[i]));
          for (const auto& [key, value] : example_kwargs) {
            if (!py::isinstance<py::str>(key))
              throw py::type_error("memslim.optimize: keyword example inputs need str keys");
            const std::string name = py::cast<std::string>(key);
            size_t idx = 0;
            for (size_t i = 1; i < args.size(); ++i)
              if (args[i].name() == name) idx = i;
            if (idx == 0)
              throw py::type_error("memslim.optimize: forward has no argument '" + name + "'");
            o.example_kwargs[name] = convert(idx, value);
          }
        }
        auto r = memslim::optimize(module, o);
        return py::make_tuple(r.module, decision_dicts(r.decisions));
      },
      py::arg("module"), py::arg("methods"), py::arg("passes"), py::arg("pipeline"),
      py::arg("example_args"), py::arg("example_kwargs"), py::arg("policy"));
  bind_fx(m);
  bind_tables(m);
  m.def("register_with_graph_executor", &memslim::registerWithGraphExecutor);
  m.def("unregister_from_graph_executor", &memslim::unregisterFromGraphExecutor);
  m.def("executor_hook_stats", []() {
    auto s = memslim::executorHookStats();
    return py::dict(py::arg("pre_runs") = s.pre_runs, py::arg("post_runs") = s.post_runs,
                    py::arg("rewrites") = s.rewrites);
  });
  m.def("reset_executor_hook_stats", &memslim::resetExecutorHookStats);
  // What memslim::activation_forward(save=True) returns besides the output, for
  // its Python fake impl: (packed bits?, exact list?), given the dtype's largest
  // finite value (elu keeps overflowed outputs' inputs). The C++ rule, not a copy.
  m.def(
      "activation_saves",
      [](const std::string& act, const std::vector<double>& params, double out_max) {
        return py::make_tuple(memslim::act_keeps_bits(act, params),
                              memslim::act_keeps_exact_list(act, params, out_max));
      },
      py::arg("act"), py::arg("params"), py::arg("out_max") = 1.7976931348623157e308);
}
