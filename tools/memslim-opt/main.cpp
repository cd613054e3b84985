//===- memslim-opt - run memslim passes over serialized TorchScript graphs ---===//
//
// mlir-opt style: reads TorchScript IR text (a file or `-` for stdin), runs
// the passes named by --passes=a,b or a --pipeline, prints the result (or
// writes it with -o, atomically: nothing is written unless every step
// succeeded). --remarks prints one line per rewrite decision to stderr;
// --print-ir-after-all prints the graph after each pass to stderr.
// Every user error is one `memslim-opt: error: ...` line and exit code 1.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/ir/irparser.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "memslim/passes/pass.h"

namespace {

struct Options {
  std::string input, output;
  std::vector<std::string> passes;
  std::string pipeline;
  bool list = false, remarks = false, print_after_all = false, help = false, split = false;
};

[[noreturn]] void fail(const std::string& msg) {
  std::cerr << "memslim-opt: error: " << msg << "\n";
  std::exit(1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") o.help = true;
    else if (a == "--list-passes") o.list = true;
    else if (a == "--remarks") o.remarks = true;
    else if (a == "--print-ir-after-all") o.print_after_all = true;
    else if (a == "--split-input-file") o.split = true;
    else if (starts_with(a, "--passes=")) o.passes = split(a.substr(9), ',');
    else if (starts_with(a, "--pipeline=")) o.pipeline = a.substr(11);
    else if (a == "-o") {
      if (++i >= argc) fail("-o needs a file name");
      o.output = argv[i];
    } else if (starts_with(a, "-o")) o.output = a.substr(2);
    else if (a != "-" && starts_with(a, "-")) fail("unknown option '" + a + "' (see --help)");
    else if (!o.input.empty()) fail("more than one input ('" + o.input + "', '" + a + "')");
    else o.input = a;
  }
  return o;
}

std::string first_line(const std::string& s) {
  auto p = s.find('\n');
  return p == std::string::npos ? s : s.substr(0, p);
}

std::string read_input(const std::string& path) {
  std::stringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream in(path);
    if (!in) fail("cannot read '" + path + "'");
    ss << in.rdbuf();
  }
  return ss.str();
}

const char* kUsage =
    "usage: memslim-opt INPUT [-o OUT] (--passes=a,b | --pipeline=NAME) [--remarks]\n"
    "                   [--print-ir-after-all] [--split-input-file] [--list-passes]\n"
    "INPUT: TorchScript IR text (.ir), or - for stdin.\n";

} // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  if (o.help) {
    std::cout << kUsage;
    return 0;
  }
  if (o.list) {
    for (const auto& p : memslim::registered_passes())
      std::cout << "  " << p.flag << " - " << p.description << "\n";
    for (const auto& p : memslim::registered_pipelines()) {
      std::cout << "  pipeline " << p.name << " - " << p.description << ":";
      for (const auto& s : p.passes) std::cout << " " << s;
      std::cout << "\n";
    }
    return 0;
  }
  if (o.input.empty()) fail("no input file (see --help)");
  if (!o.passes.empty() && !o.pipeline.empty()) fail("give --passes or --pipeline, not both");

  std::vector<const memslim::PassInfo*> plan;
  std::vector<std::string> names = o.passes;
  if (!o.pipeline.empty()) {
    const auto* pl = memslim::find_pipeline(o.pipeline);
    if (!pl) fail("unknown pipeline '" + o.pipeline + "' (see --list-passes)");
    names = pl->passes;
  }
  for (const auto& n : names) {
    const auto* p = memslim::find_pass(n);
    if (!p) fail("unknown pass '" + n + "' (see --list-passes)");
    plan.push_back(p);
  }

  const std::string text = read_input(o.input);
  // --split-input-file: each chunk between lines "# -----" is its own graph
  // (lit files hold one small case per chunk); results are joined by "// -----".
  std::vector<std::string> chunks;
  if (o.split) {
    std::stringstream in(text);
    std::string line, cur;
    while (std::getline(in, line)) {
      if (line.rfind("# -----", 0) == 0) {
        chunks.push_back(cur);
        cur.clear();
      } else {
        cur += line + "\n";
      }
    }
    chunks.push_back(cur);
  } else {
    chunks.push_back(text);
  }

  std::string result;
  for (size_t c = 0; c < chunks.size(); ++c) {
    auto graph = std::make_shared<torch::jit::Graph>();
    try {
      torch::jit::parseIR(chunks[c], graph.get());
    } catch (const std::exception& e) {
      fail("cannot parse '" + o.input + "'" + (o.split ? " (case " + std::to_string(c + 1) + ")" : "") +
           " as TorchScript IR: " + first_line(e.what()));
    }
    memslim::PassContext ctx;
    try {
      for (const auto* p : plan) {
        p->run(graph, ctx);
        if (o.print_after_all)
          std::cerr << "// -----// IR after " << p->flag << " //----- //\n" << graph->toString();
      }
    } catch (const std::exception& e) {
      fail(std::string("pass failed: ") + first_line(e.what()));
    }
    if (o.remarks)
      for (const auto& r : ctx.remarks.lines()) std::cerr << r << "\n";
    if (c > 0) result += "// -----\n";
    result += graph->toString();
  }

  if (o.output.empty()) {
    std::cout << result;
    return 0;
  }
  const std::string tmp = o.output + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out || !(out << result)) {
      std::remove(tmp.c_str());
      fail("cannot write '" + o.output + "'");
    }
  }
  if (std::rename(tmp.c_str(), o.output.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("cannot write '" + o.output + "'");
  }
  return 0;
}
