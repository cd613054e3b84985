//===- memslim-opt - run memslim passes over serialized TorchScript graphs ---===//
//
// mlir-opt style: reads TorchScript IR text (a file or `-` for stdin), runs
// the passes named by --passes=a,b or a --pipeline, prints the result (or
// writes it with -o, atomically: nothing is written unless every step
// succeeded). --remarks prints one line per rewrite decision to stderr;
// --print-ir-after-all prints the graph after each pass to stderr.
// Every failure (user error, invalid graph, an exception from the interpreter,
// autograd or the allocator, a failed --verify) is one `memslim-opt: error: ...`
// line on stderr, exit code 1 and no output file. The printed IR parses back.
//
// This file: the dispatch. The parts: options (flags, --help), inputs
// (example tensors), verify (--verify), ir_text (IR text in and out),
// archives (.pt in and out), fork_server (--fork-server), pt2 (.pt2 input,
// handed to python -m memslim.opt_pt2); support (errors, text).
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/runtime/print_handler.h>
#include <torch/script.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "memslim/jit/pass.h"
#include "memslim_opt.h"
#include "options.h"
#include "support.h"

namespace memslim_opt {

namespace {

// Help, the pass list, or the input read, rewritten and written.
int run(const Options& o) {
  if (o.help) {
    print_help();
    return 0;
  }
  if (o.list) {
    print_passes();
    return 0;
  }
  if (o.input.empty()) fail("no input file (see --help)");
  if (!o.passes.empty() && !o.pipeline.empty()) fail("give --passes or --pipeline, not both");

  std::vector<const memslim::PassInfo*> plan;
  try { // neither --passes nor --pipeline: no pass (reads and prints the input)
    if (!o.passes.empty() || !o.pipeline.empty())
      plan = memslim::resolve_plan(o.passes, o.pipeline);
  } catch (const std::invalid_argument& e) {
    fail(std::string(e.what()) + " (see --list-passes)");
  }
  std::vector<std::string> names;
  for (const auto* p : plan) names.push_back(p->flag);

  if (is_archive(o.input)) return run_archive(o, names);
  return run_ir(o, plan);
}

// torch's warnings (aten::warn in a graph, deprecations) as one stderr line each,
// so that stderr stays lines memslim-opt wrote.
class OneLineWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override {
    std::string msg = trim(w.msg());
    const auto nl = msg.find('\n');
    if (nl != std::string::npos) msg = trim(msg.substr(0, nl));
    std::cerr << "memslim-opt: warning: " << printable(msg) << "\n";
  }
};

} // namespace

// memslim-opt as a process, from its arguments to its exit code.
int tool_main(int argc, char** argv) {
  // A last resort: an exception escaping a noexcept frame still ends as one line.
  std::set_terminate([] {
    const std::string what = terminating_exception(/*c10_only=*/false);
    if (!g_partial_output.empty()) std::remove(g_partial_output.c_str());
    std::fprintf(stderr, "memslim-opt: error: internal error: %s\n", printable(what).c_str());
    std::fflush(stderr);
    _exit(1);
  });
  // stdout carries the IR: prim::Print in a graph run by --verify prints nowhere.
  torch::jit::setPrintHandler([](const std::string&) {});
  static OneLineWarnings warnings;
  c10::WarningUtils::set_warning_handler(&warnings);
  try {
    return run(parse_args(argc, argv));
  } catch (const std::bad_alloc&) {
    fail("out of memory");
  } catch (const std::exception& e) {
    fail(one_line(e));
  } catch (...) {
    fail("unknown exception");
  }
}

} // namespace memslim_opt

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--fork-server") return memslim_opt::fork_server();
  if (memslim_opt::has_pt2_input(argc, argv)) return memslim_opt::exec_pt2(argc, argv);
  return memslim_opt::tool_main(argc, argv);
}
