//===- table_bindings.cpp - The pass, pipeline and policy tables for Python -===//
//
// What: memslim._C's view of the core's tables: the policy options (their
// names, help and defaults: python/memslim/_policy.py generates every entry
// point's keywords from them), the pass table and each pipeline as a front
// end runs it (core/pass_table.h), and per-pass statistics of decision
// records (core/statistics.h: memslim.report(x).statistics(), the counts
// memslim-opt --stats prints).
// Why: one table per fact; Python reads the C++ table instead of a copy.
//
//===----------------------------------------------------------------------===//
#include "bindings.h"
#include "memslim/core/pass_table.h"
#include "memslim/core/statistics.h"
#include "memslim/fx/fx_front_end.h"

namespace memslim_py {

void bind_tables(py::module& m) {
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
  m.def("fx_default_passes", []() { return memslim::fx_default_passes(); });
  // Per-pass statistics (core/statistics.h) of decision records given as their dicts
  // (memslim.Decision.as_dict()): ([{pass, sites, rewritten, kept, rolled_back,
  // bytes_freed, bytes_before, bytes_after, kept_by_reason}], the text memslim-opt --stats prints).
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
      e["bytes_before"] = s.bytes_before;
      e["bytes_after"] = s.bytes_after;
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

} // namespace memslim_py
