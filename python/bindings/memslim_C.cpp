//===- memslim_C.cpp - Python bindings of the pass library -----------------===//
//
// What: memslim._C.optimize(script_module._c, ...) -> (cloned module, decision
// records as dicts),
// and the pass/pipeline lists. torch's pybind11 casters take torch._C objects
// (ScriptModule, Tensor) directly.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/python.h>

#include "memslim/activation_spec.h"
#include "memslim/core/pass_table.h"
#include "memslim/core/statistics.h"
#include "memslim/fx/fx_front_end.h"
#include "memslim/jit/executor_hook.h"
#include "memslim/jit/optimize.h"
#include "memslim/kernels/activations.h"

namespace py = pybind11;

namespace {
// Policy keywords, checked by passes/policy.cpp's table as memslim-opt's flags
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
} // namespace

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
  // The FX front end (python/memslim/fx.py): the graph as value and node
  // records -> (decision records, [(node index, memslim op name)]).
  // values: (name, is_tensor, numel or None, dtype or None, has_constant,
  // constant); nodes: (kind, overload or None for no registered op, input
  // value ids, output value ids); values may carry a 7th field, the device
  // type ("cpu", "cuda") or None, and an 8th, whether it requires grad when
  // known (a buffer, a value made under no_grad) or None; an optional 9th,
  // whether it is a parameter or buffer of the module (export's placeholders);
  // an optional 10th, its number of dimensions or None; an optional 11th,
  // whether it is contiguous, or None; an optional 12th, its sizes (hints), or
  // None where one is unknown.
  m.def(
      "fx_run",
      [](const py::list& values, const py::list& nodes,
         const std::optional<std::vector<std::string>>& passes, const py::dict& policy) {
        memslim::FxGraphView g;
        for (const auto& item : values) {
          const auto t = py::cast<py::tuple>(item);
          memslim::FxGraphView::Value v;
          v.name = py::cast<std::string>(t[0]);
          v.tensor = py::cast<bool>(t[1]);
          if (!t[2].is_none()) v.numel = py::cast<int64_t>(t[2]);
          if (!t[3].is_none()) v.dtype = py::cast<at::ScalarType>(t[3]);
          if (t.size() > 6 && !t[6].is_none())
            v.device = c10::Device(py::cast<std::string>(t[6])).type();
          if (t.size() > 7 && !t[7].is_none()) v.requires_grad = py::cast<bool>(t[7]);
          if (t.size() > 8) v.module_state = py::cast<bool>(t[8]);
          if (t.size() > 9 && !t[9].is_none()) v.rank = py::cast<int64_t>(t[9]);
          if (t.size() > 10 && !t[10].is_none()) v.contiguous = py::cast<bool>(t[10]);
          if (t.size() > 11 && !t[11].is_none()) v.sizes = py::cast<std::vector<int64_t>>(t[11]);
          if (py::cast<bool>(t[4])) {
            v.constant = constant_ivalue(t[5]); // nullopt: unknown to the rules
          }
          g.add_value(std::move(v));
        }
        for (const auto& item : nodes) {
          const auto t = py::cast<py::tuple>(item);
          g.add_node(py::cast<std::string>(t[0]), py::cast<std::optional<std::string>>(t[1]),
                     py::cast<std::vector<size_t>>(t[2]), py::cast<std::vector<size_t>>(t[3]));
        }
        // None: the default pipeline; []: no pass (the budget's ladder alone).
        const auto r = memslim::run_fx(g, passes ? *passes : memslim::fx_default_passes(),
                                       policy_from_dict(policy));
        py::list rewrites;
        // (node index, op name, overload, args or None, erased node indices,
        // region or None); args: ("v", value id) or ("c", constant); region:
        // (node indices, input value ids, output value ids, the op's output
        // value ids, index of the node the op goes before, graph text).
        for (const auto& rw : r.rewrites) {
          py::object args = py::none();
          if (rw.args) {
            py::list a;
            for (const auto& arg : *rw.args)
              if (arg.value)
                a.append(py::make_tuple("v", *arg.value));
              else
                a.append(py::make_tuple("c", torch::jit::toPyObject(arg.constant)));
            args = a;
          }
          py::object region = py::none();
          if (rw.region)
            region = py::make_tuple(rw.region->nodes, rw.region->inputs, rw.region->outputs,
                                    rw.region->new_outputs, rw.region->before, rw.region->ir);
          rewrites.append(py::make_tuple(rw.node, rw.kind, rw.overload, args, rw.erased, region));
        }
        // The memory budget's ladders (whole blocks; pieces): None, or (why,
        // blocks found, [refusal], [(kept, peak, flops, move, [[node ids] per run])]).
        auto ladder_tuple = [](const std::optional<memslim::FxLadder>& L) -> py::object {
          if (!L) return py::none();
          py::list steps;
          for (const memslim::FxLadderStep& s : L->steps)
            steps.append(py::make_tuple(s.kept, s.peak, s.flops, s.move, s.runs, s.light));
          return py::make_tuple(L->why, L->segments, L->refused, steps);
        };
        py::object ladder = ladder_tuple(r.ladder), pieces = ladder_tuple(r.pieces);
        // Coupling chains: [(covered node indices, bytes kept today, bytes kept after)].
        py::list chains;
        for (const memslim::FxChain& c : r.chains)
          chains.append(py::make_tuple(c.covers, c.kept_before, c.kept_after));
        return py::make_tuple(decision_dicts(r.decisions), rewrites, ladder, pieces, chains);
      },
      py::arg("values"), py::arg("nodes"), py::arg("passes"), py::arg("policy"));
  // A policy flag's text as memslim-opt reads it (PolicyValue::parse: an
  // integer, else a number, else the text), for memslim.opt_pt2's flags.
  m.def("parse_policy_value", [](const std::string& text) -> py::object {
    const memslim::PolicyValue v = memslim::PolicyValue::parse(text);
    using K = memslim::PolicyValue::Kind;
    if (v.kind == K::Int) return py::cast(v.i);
    if (v.kind == K::Double) return py::cast(v.d);
    return py::cast(text);
  });
  m.def("check_policy", [](const py::dict& policy) { policy_from_dict(policy); });
  m.def("policy_options", []() {
    py::list out;
    for (const memslim::PolicyOption& po : memslim::policy_options())
      out.append(py::make_tuple(po.name, po.value_help, po.help));
    return out;
  });
  // {name: default} as Python reads it (None where the default is "no value": no
  // bound, automatic, no budget): the keywords' defaults of every entry point.
  m.def("policy_defaults", []() {
    py::dict out;
    const memslim::CostPolicy defaults;
    for (const memslim::PolicyOption& po : memslim::policy_options()) {
      const memslim::PolicyValue v = po.get(defaults);
      using K = memslim::PolicyValue::Kind;
      out[po.name] = v.kind == K::Int      ? py::object(py::int_(v.i))
                     : v.kind == K::Double ? py::object(py::float_(v.d))
                                           : py::object(py::none());
    }
    return out;
  });
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
  m.def("fx_default_passes", []() { return memslim::fx_default_passes(); });
  // Per-pass statistics (core/statistics.h) of decision records given as their dicts
  // (memslim.Decision.as_dict()): ([{pass, sites, rewritten, kept, rolled_back,
  // bytes_freed, kept_by_reason}], the text memslim-opt --stats prints).
  m.def("pass_statistics", [](const py::list& records) {
    std::vector<memslim::Decision> ds;
    for (const auto& r : records) {
      const auto rec = py::reinterpret_borrow<py::dict>(r);
      memslim::Decision d;
      d.pass = py::cast<std::string>(rec["pass"]);
      const std::string v = py::cast<std::string>(rec["verdict"]);
      for (auto k : {memslim::Decision::Verdict::Rewrote, memslim::Decision::Verdict::Kept,
                     memslim::Decision::Verdict::RolledBack, memslim::Decision::Verdict::Note})
        if (v == memslim::verdict_name(k)) d.verdict = k;
      d.text = py::cast<std::string>(rec["text"]);
      if (!rec["bytes_before"].is_none()) d.price.before = py::cast<int64_t>(rec["bytes_before"]);
      if (!rec["bytes_after"].is_none()) d.price.after = py::cast<int64_t>(rec["bytes_after"]);
      ds.push_back(std::move(d));
    }
    const auto stats = memslim::pass_statistics(ds);
    py::list out;
    for (const auto& s : stats) {
      py::dict e;
      e["pass"] = s.pass;
      e["sites"] = s.sites;
      e["rewritten"] = s.rewritten;
      e["kept"] = s.kept;
      e["rolled_back"] = s.rolled_back;
      e["bytes_freed"] = s.bytes_freed;
      e["kept_by_reason"] = s.kept_by_reason;
      out.append(e);
    }
    return py::make_tuple(out, memslim::render_statistics(stats));
  });
  // The pass table (core/pass_table.h): flags, and a pipeline's steps as a front end runs
  // them ("torchscript", "fx" or "compile").
  m.def("list_passes", []() {
    std::vector<std::string> out;
    for (const auto& p : memslim::pass_table()) out.push_back(p.flag);
    return out;
  });
  m.def(
      "pipeline_passes",
      [](const std::string& name, const std::string& front_end) {
        const memslim::PipelineSpec* p = memslim::find_pipeline_spec(name);
        if (!p) throw py::value_error("unknown pipeline '" + name + "'");
        if (front_end == "torchscript") return p->passes(memslim::FrontEnd::Jit);
        if (front_end == "fx") return p->passes(memslim::FrontEnd::Fx);
        if (front_end == "compile") return p->passes(memslim::FrontEnd::Compile);
        throw py::value_error("front_end must be 'torchscript', 'fx' or 'compile', got '" +
                              front_end + "'");
      },
      py::arg("name") = "memslim-default", py::arg("front_end") = "torchscript");
}
