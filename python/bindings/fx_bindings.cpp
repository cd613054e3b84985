//===- fx_bindings.cpp - The FX front end's typed boundary -----------------===//
//
// What: memslim._C.FxGraph, the FX graph as the core reads it (values with
// their tensor facts, nodes with their ops), built once per graph by
// python/memslim/fx.py's _Serializer through named keyword arguments; and
// memslim._C.fx_run(graph, passes, policy) -> FxRun, whose fields are named:
// records (decision dicts), rewrites (FxRewrite: node, kind, overload, args of
// FxArg, erased, region: FxRegion), ladder / pieces (FxLadder of FxLadderStep)
// and chains (FxChain). Each run builds a fresh FxGraphView from the graph's
// records (a run rewrites its view), so one FxGraph serves every run of a
// compile: the coupling chains, the pipeline and the budget's plain ladder.
// Why: the boundary used to be positional tuples ("an optional 7th ... 12th
// field") and a graph was serialised from Python once per run.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/python/pybind_utils.h>

#include "bindings.h"
#include "memslim/fx/fx_front_end.h"
#include "memslim/fx/fx_graph_view.h"

namespace memslim_py {
namespace {

// The graph's records, kept in C++ between runs.
struct FxGraph {
  struct NodeSpec {
    std::string kind;
    std::optional<std::string> overload; // none: no registered op
    std::vector<size_t> inputs, outputs;
  };
  std::vector<memslim::FxGraphView::Value> values;
  std::vector<NodeSpec> nodes;

  size_t add(memslim::FxGraphView::Value v) {
    values.push_back(std::move(v));
    return values.size() - 1;
  }
  // The view a run rewrites; throws std::invalid_argument (ValueError) for an op
  // the dispatcher does not know or a bad value id, as FxGraphView::add_node.
  void build(memslim::FxGraphView& g) const {
    for (const auto& v : values) g.add_value(v);
    for (const auto& n : nodes) g.add_node(n.kind, n.overload, n.inputs, n.outputs);
  }
};

// What one run returns: the decision records as dicts, the rest as the core made it.
struct FxRun {
  py::list records;
  memslim::FxResult result;
};

void bind_graph(py::module& m) {
  using Value = memslim::FxGraphView::Value;
  py::class_<FxGraph>(m, "FxGraph",
                      "An FX graph as the core reads it (passes/include/memslim/fx/"
                      "fx_graph_view.h): values, then the nodes reading and making them.")
      .def(py::init<>())
      .def(
          "add_tensor",
          [](FxGraph& g, const std::string& name, std::optional<int64_t> numel,
             std::optional<at::ScalarType> dtype, std::optional<std::string> device,
             std::optional<bool> requires_grad, bool state, std::optional<int64_t> rank,
             std::optional<bool> contiguous, std::optional<std::vector<int64_t>> sizes) {
            Value v;
            v.name = name;
            v.tensor = true;
            v.numel = numel;
            v.dtype = dtype;
            if (device) v.device = c10::Device(*device).type();
            v.requires_grad = requires_grad;
            v.module_state = state;
            v.rank = rank;
            v.contiguous = contiguous;
            v.sizes = std::move(sizes);
            return g.add(std::move(v));
          },
          "A tensor value; None where a fact is unknown (a symbolic size without a hint). "
          "requires_grad: known for a buffer or a value made under no_grad; state: a "
          "parameter or buffer of the module. Returns its id.",
          py::arg("name"), py::kw_only(), py::arg("numel"), py::arg("dtype"), py::arg("device"),
          py::arg("requires_grad"), py::arg("state"), py::arg("rank"), py::arg("contiguous"),
          py::arg("sizes"))
      .def(
          "add_opaque",
          [](FxGraph& g, const std::string& name) {
            Value v;
            v.name = name;
            return g.add(std::move(v));
          },
          "A value that is not a tensor and not a known constant (a list, a tuple nobody "
          "unpacked, a Python object). Returns its id.",
          py::arg("name"))
      .def(
          "add_constant",
          [](FxGraph& g, const std::string& name, py::handle obj) {
            Value v;
            v.name = name;
            v.constant = constant_ivalue(obj); // nullopt: unknown to the rules
            return g.add(std::move(v));
          },
          "A constant argument (None, bool, int, float, str, lists of numbers are known to "
          "the rules; others are opaque). Returns its id.",
          py::arg("name"), py::arg("value"))
      .def(
          "add_node",
          [](FxGraph& g, const std::string& kind, std::optional<std::string> overload,
             std::vector<size_t> inputs, std::vector<size_t> outputs) {
            g.nodes.push_back({kind, std::move(overload), std::move(inputs), std::move(outputs)});
            return g.nodes.size() - 1;
          },
          "A node: kind 'aten::gelu' with overload '' (the dispatcher's schema) or None (no "
          "registered op: prims, Python callables); value ids. Returns its id.",
          py::arg("kind"), py::arg("overload"), py::arg("inputs"), py::arg("outputs"))
      .def_property_readonly("num_values", [](const FxGraph& g) { return g.values.size(); })
      .def_property_readonly("num_nodes", [](const FxGraph& g) { return g.nodes.size(); });
}

void bind_results(py::module& m) {
  using namespace memslim;
  py::class_<FxArg>(m, "FxArg", "An argument of a rewritten node: a value id, or a constant.")
      .def_readonly("value", &FxArg::value)
      .def_property_readonly("constant",
                             [](const FxArg& a) { return torch::jit::toPyObject(a.constant); });
  py::class_<FxRegion>(m, "FxRegion", "A recompute region replaced by one op.")
      .def_readonly("nodes", &FxRegion::nodes)
      .def_readonly("inputs", &FxRegion::inputs)
      .def_readonly("outputs", &FxRegion::outputs)
      .def_readonly("new_outputs", &FxRegion::new_outputs)
      .def_readonly("before", &FxRegion::before)
      .def_readonly("ir", &FxRegion::ir);
  py::class_<FxRewrite>(m, "FxRewrite", "A node's new op (fx_front_end.h).")
      .def_readonly("node", &FxRewrite::node)
      .def_readonly("kind", &FxRewrite::kind)
      .def_readonly("overload", &FxRewrite::overload)
      .def_readonly("args", &FxRewrite::args)
      .def_readonly("erased", &FxRewrite::erased)
      .def_readonly("region", &FxRewrite::region);
  py::class_<FxLadderStep>(m, "FxLadderStep", "One step of a budget ladder.")
      .def_readonly("kept", &FxLadderStep::kept)
      .def_readonly("peak", &FxLadderStep::peak)
      .def_readonly("flops", &FxLadderStep::flops)
      .def_readonly("move", &FxLadderStep::move)
      .def_readonly("runs", &FxLadderStep::runs)
      .def_readonly("light", &FxLadderStep::light);
  py::class_<FxLadder>(m, "FxLadder", "The memory budget's ladder (core/recompute_blocks.h).")
      .def_readonly("why", &FxLadder::why)
      .def_readonly("segments", &FxLadder::segments)
      .def_readonly("refused", &FxLadder::refused)
      .def_readonly("steps", &FxLadder::steps);
  py::class_<FxChain>(m, "FxChain", "A coupling chain: the nodes it covers, bytes before / after.")
      .def_readonly("covers", &FxChain::covers)
      .def_readonly("kept_before", &FxChain::kept_before)
      .def_readonly("kept_after", &FxChain::kept_after);
  py::class_<FxRun>(m, "FxRun", "What fx_run returns.")
      .def_readonly("records", &FxRun::records)
      .def_property_readonly("rewrites", [](const FxRun& r) { return r.result.rewrites; })
      .def_property_readonly("ladder", [](const FxRun& r) { return r.result.ladder; })
      .def_property_readonly("pieces", [](const FxRun& r) { return r.result.pieces; })
      .def_property_readonly("chains", [](const FxRun& r) { return r.result.chains; });
}

// fx_run's `ladders` argument.
memslim::FxLadders ladders_from(const std::string& name) {
  using memslim::FxLadders;
  static const std::pair<const char*, FxLadders> kNames[] = {{"both", FxLadders::Both},
                                                             {"op", FxLadders::Op},
                                                             {"tags", FxLadders::Tags},
                                                             {"none", FxLadders::None}};
  for (const auto& [n, which] : kNames)
    if (name == n) return which;
  throw std::invalid_argument("fx_run: ladders must be 'both', 'op', 'tags' or 'none', got '" +
                              name + "'");
}

} // namespace

void bind_fx(py::module& m) {
  bind_graph(m);
  bind_results(m);
  m.def(
      "fx_run",
      [](const FxGraph& graph, const std::optional<std::vector<std::string>>& passes,
         const py::dict& policy, const std::string& ladders) {
        memslim::FxGraphView g;
        graph.build(g);
        // None: the default pipeline; []: no pass (the budget's ladder alone).
        FxRun run;
        run.result = memslim::run_fx(g, passes ? *passes : memslim::fx_default_passes(),
                                     policy_from_dict(policy), ladders_from(ladders));
        run.records = decision_dicts(run.result.decisions);
        return run;
      },
      "Runs `passes` (None: the FX default pipeline) over the graph, then the budget's "
      "ladders named by `ladders` ('both', 'op': the whole blocks', 'tags': the pieces', "
      "'none') when the policy has a memory_budget.",
      py::arg("graph"), py::arg("passes"), py::arg("policy"), py::arg("ladders") = "both");
}

} // namespace memslim_py
