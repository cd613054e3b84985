//===- ir_text.cpp - TorchScript IR text in and out -----------------------===//
//
// What: IR text input (a file or `-`, split into lit-style cases by
// --split-input-file): each case parsed and validated, its example inputs
// made (--input-shapes, or its signature's complete tensor types), shapes
// recorded for the cost model, the passes run (or the memory-budget planner),
// remarks, --verify, and the cases printed back as text parseIR reads.
// Why: the lit tests and the fuzzers speak IR text; line numbers in parse
// errors are the file's, case by case.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/ir/irparser.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "inputs.h"
#include "memslim/core/statistics.h"
#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/optimize.h"
#include "memslim/jit/recompute_blocks.h"
#include "memslim/jit/validate_graph.h"
#include "memslim_opt.h"
#include "support.h"
#include "verify.h"

namespace memslim_opt {

using torch::jit::Graph;
using torch::jit::Value;

// Graph::toString prints a node without outputs as ` = prim::Print(%x)`, which
// parseIR does not read; it reads `prim::Print(%x)`.
std::string parseable(const std::string& ir) {
  std::string out;
  for (const auto& line : lines_of(ir)) {
    const auto b = line.find_first_not_of(' ');
    // the printer writes indent + "" + " = " + node: drop the " = "
    if (b != std::string::npos && b > 0 && line.compare(b, 2, "= ") == 0)
      out += line.substr(0, b - 1) + line.substr(b + 2);
    else
      out += line;
    out += "\n";
  }
  return out;
}

namespace {

std::string read_input(const std::string& path) {
  std::stringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read '" + path + "'");
    ss << in.rdbuf();
    if (in.bad()) fail("cannot read '" + path + "'");
  }
  return ss.str();
}

// The text of case `c` of a --split-input-file input, padded with empty lines
// so that line numbers in errors are the file's. Cases are separated by lines
// starting with "# -----" (lit files) or "// -----" (memslim-opt's own output).
std::vector<std::string> split_cases(const std::string& text, bool split_input) {
  if (!split_input) return {text};
  std::vector<std::string> chunks;
  std::string cur;
  size_t line_no = 0, start = 0;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (starts_with(line, "# -----") || starts_with(line, "// -----")) {
      chunks.push_back(std::string(start, '\n') + cur);
      cur.clear();
      start = line_no + 1;
    } else {
      cur += line + "\n";
    }
    ++line_no;
  }
  chunks.push_back(std::string(start, '\n') + cur);
  return chunks;
}

// Case `chunk` parsed and validated; `where` names it in errors.
std::shared_ptr<Graph> parse_case(const std::string& chunk, const std::string& where) {
  auto graph = std::make_shared<Graph>();
  try {
    torch::jit::parseIR(chunk, graph.get());
  } catch (const std::exception& e) {
    const std::string msg = one_line(e, chunk);
    const std::string detail = torch_check_detail(msg);
    fail("cannot parse " + where + " as TorchScript IR: " + (detail.empty() ? msg : detail));
  }
  if (auto bad = memslim::validate_graph(graph)) fail(where + ": " + *bad);
  return graph;
}

// Example inputs: --input-shapes, or the signature's complete tensor types
// (nullopt when some input has none; an error then if --verify needs them).
std::optional<Example> case_inputs(const Options& o, const std::shared_ptr<Graph>& graph,
                                   const std::vector<c10::TypePtr>& signature,
                                   const std::string& where) {
  std::vector<std::string> input_names;
  for (const Value* v : graph->inputs()) input_names.push_back("%" + v->debugName());
  std::optional<Example> ex;
  std::string untyped;
  if (!o.input_specs.empty())
    ex = inputs_from_specs(signature, input_names, o.input_specs);
  else
    ex = inputs_from_types(graph, untyped);
  if (o.verify && !ex)
    fail("--verify needs --input-shapes" +
         (untyped.empty() ? std::string()
                          : " (" + where + ": input " + untyped + " has no complete tensor type)"));
  return ex;
}

// The recording run on `ex` (shapes for the cost model); returns the graph as
// it is then, the input of --verify.
std::shared_ptr<Graph> record_case_shapes(const Options& o, const std::shared_ptr<Graph>& graph,
                                          const Example& ex) {
  // Values whose written type is complete keep it when the shapes come from
  // the signature (the recording run sees no grad: it would drop requires_grad).
  std::unordered_map<Value*, c10::TypePtr> written;
  if (o.input_specs.empty()) {
    std::shared_ptr<Graph> g = graph;
    torch::jit::DepthFirstGraphNodeIterator it(g);
    for (auto* n = it.next(); n; n = it.next())
      for (Value* v : n->outputs())
        if (v->isCompleteTensor()) written[v] = v->type();
  }
  try {
    memslim::record_shapes(graph, ex.values);
  } catch (const std::exception& e) {
    fail(std::string(o.input_specs.empty() ? "recording run on the signature's types"
                                           : "--input-shapes") +
         ": " + one_line(e));
  }
  for (auto& [v, t] : written) v->setType(t);
  return graph->copy();
}

// The plan's passes over `graph` (or the memory-budget planner), the IR
// printed after each with --print-ir-after-all.
void run_plan(const Options& o, const std::vector<const memslim::PassInfo*>& plan,
              const std::shared_ptr<Graph>& graph, memslim::PassContext& ctx) {
  try {
    auto after = [&](const memslim::PassInfo& p) {
      if (o.print_after_all)
        std::cerr << "// -----// IR after " << p.flag << " //----- //\n" << graph->toString();
    };
    if (ctx.policy.memory_budget > 0) {
      memslim::run_with_memory_budget(plan, graph, ctx, after);
    } else {
      for (const auto* p : plan) {
        memslim::run_pass(*p, graph, ctx);
        after(*p);
      }
    }
  } catch (const std::exception& e) {
    fail(std::string("pass failed: ") + one_line(e));
  }
}

// One case from text to rewritten text; `where` names it in errors.
std::string rewrite_case(const Options& o, const std::vector<const memslim::PassInfo*>& plan,
                         const std::string& chunk, const std::string& where) {
  std::shared_ptr<Graph> graph = parse_case(chunk, where);
  std::vector<c10::TypePtr> signature;
  for (const Value* v : graph->inputs()) signature.push_back(v->type());
  const std::optional<Example> ex = case_inputs(o, graph, signature, where);
  std::shared_ptr<Graph> original;
  if (ex) original = record_case_shapes(o, graph, *ex);
  memslim::PassContext ctx;
  ctx.policy = o.policy;
  ctx.strict = o.verify;
  run_plan(o, plan, graph, ctx);
  // The printed signature is the input's own.
  for (size_t i = 0; i < signature.size(); ++i) graph->inputs()[i]->setType(signature[i]);
  if (o.remarks)
    for (const auto& r : ctx.remarks.lines()) std::cerr << r << "\n";
  if (o.stats)
    std::cerr << memslim::render_statistics(memslim::pass_statistics(ctx.remarks.decisions()));
  if (o.verify) {
    const auto before = without_warnings(original);
    verify(before, without_warnings(graph), {}, *ex, {}, {},
           [&](bool rewritten) -> std::optional<RunResult> {
             return run_with_grads(rewritten ? without_warnings(graph) : before, {}, in_double(*ex),
                                   {});
           });
  }
  return parseable(graph->toString());
}

} // namespace

int run_ir(const Options& o, const std::vector<const memslim::PassInfo*>& plan) {
  const std::string text = read_input(o.input);
  const std::vector<std::string> chunks = split_cases(text, o.split);

  std::string result;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::string where =
        "'" + o.input + "'" + (o.split ? " (case " + std::to_string(c + 1) + ")" : "");
    const std::string rewritten = rewrite_case(o, plan, chunks[c], where);
    if (c > 0) result += "// -----\n";
    result += rewritten;
  }

  if (o.output.empty()) {
    std::cout << result;
    std::cout.flush();
    if (!std::cout) fail("cannot write the output");
    return 0;
  }
  write_atomically(o.output, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    if (!out || !(out << result) || !out.flush()) throw std::runtime_error("write failed");
  });
  return 0;
}

} // namespace memslim_opt
