//===- options.cpp - memslim-opt's command line ---------------------------===//
//
// What: parse_args (flags, -o, the one input; the policy flags come from
// passes/core/policy.cpp's table, shared with memslim.optimize's keywords), the
// --input-shapes tokens' syntax, the --help text and --list-passes.
// Why: one table of what memslim-opt accepts; every other file takes Options.
//
//===----------------------------------------------------------------------===//
#include "options.h"

#include <iostream>

#include "memslim/core/pass_table.h"
#include "support.h"

namespace memslim_opt {

bool is_shape_token(const std::string& t) {
  if (t == "scalar") return true;
  for (const auto& d : split(t, 'x')) {
    long long v = 0;
    if (!parse_int(d, v) || v < 0 || d[0] == '+' || d[0] == '-') return false;
  }
  return !t.empty() && t.front() != 'x' && t.back() != 'x' && t.find("xx") == std::string::npos;
}

// "4x3x32x32,16,0.5,true" -> tokens; each is a shape, a number, true/false or
// none, and is read against the type of the graph input it is for.
std::vector<std::string> parse_input_specs(const std::string& spec) {
  const std::string usage = "bad --input-shapes '" + spec +
                            "': expected sizes like 4x3x32x32,16 (or values for int, float, bool "
                            "inputs: 3, 0.5, true, none)";
  std::vector<std::string> tokens = split(spec, ',');
  if (tokens.empty()) fail(usage);
  for (const auto& t : tokens) {
    double d = 0;
    if (!is_shape_token(t) && !parse_double(t, d) && t != "true" && t != "false" && t != "none")
      fail(usage);
  }
  return tokens;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help")
      o.help = true;
    else if (a == "--list-passes")
      o.list = true;
    else if (a == "--remarks")
      o.remarks = true;
    else if (a == "--stats")
      o.stats = true;
    else if (a == "--print-ir-after-all")
      o.print_after_all = true;
    else if (a == "--split-input-file")
      o.split = true;
    else if (a == "--verify")
      o.verify = true;
    else if (starts_with(a, "--input-shapes="))
      o.input_specs = parse_input_specs(a.substr(15));
    else if (const memslim::PolicyOption* po =
                 starts_with(a, "--") && a.find('=') != std::string::npos
                     ? memslim::find_policy_option(a.substr(0, a.find('=')))
                     : nullptr) {
      // The policy options: passes/core/policy.cpp's table.
      const std::string why =
          po->set(o.policy, memslim::PolicyValue::parse(a.substr(a.find('=') + 1)));
      if (!why.empty()) fail("bad value in '" + a + "': expected " + why);
    } else if (starts_with(a, "--passes="))
      o.passes = split(a.substr(9), ',');
    else if (starts_with(a, "--pipeline="))
      o.pipeline = a.substr(11);
    else if (a == "-o") {
      if (++i >= argc) fail("-o needs a file name");
      o.output = argv[i];
    } else if (starts_with(a, "-o"))
      o.output = a.substr(2);
    else if (starts_with(a, "--peak-memory"))
      // A peak is a promise about a step that runs: planned and measured where it runs.
      fail(
          "--peak-memory: a training step's peak is planned and measured where the step runs "
          "(memslim.compile(model, peak_memory=...) or memslim.optimize(model, example_inputs, "
          "peak_memory=...)); here --memory-budget plans the saved bytes");
    else if (a != "-" && starts_with(a, "-"))
      fail("unknown option '" + a + "' (see --help)");
    else if (!o.input.empty())
      fail("more than one input ('" + o.input + "', '" + a + "')");
    else
      o.input = a;
  }
  return o;
}

namespace {

// The policy flags come from passes/core/policy.cpp's table (print_help appends them).
const char* kUsage =
    "usage: memslim-opt INPUT [-o OUT] (--passes=a,b | --pipeline=NAME) [--remarks] [--stats]\n"
    "                   [--input-shapes=AxB,C] [--verify] [--print-ir-after-all]\n"
    "                   [--split-input-file] [--list-passes] [POLICY...]\n"
    "INPUT: TorchScript IR text (.ir, or - for stdin), a TorchScript archive (.pt: every\n"
    "method is rewritten, -o writes an archive that torch.jit.load reads once memslim is\n"
    "imported) or a torch.export archive (.pt2: the FX front end, python -m memslim.opt_pt2;\n"
    "-o writes a .pt2 that torch.export.load reads once memslim is imported; --passes,\n"
    "--remarks, --stats and the policy flags apply; --pipeline=NAME, or no --passes, runs the\n"
    "pipeline's FX steps, which --list-passes prints beside the TorchScript ones).\n"
    "--stats: per pass, sites decided, rewritten, kept by reason and bytes freed (stderr,\n"
    "after the remarks; counted from the decision records).\n"
    "--input-shapes: one entry per input of the graph (or of forward): a shape\n"
    "for a tensor (fp32 unless the signature gives a dtype; 'scalar' for 0-dim), a value\n"
    "for an int, float or bool input, 'none' for an optional one. Without it, complete\n"
    "tensor types in an IR signature (Float(8, 16, strides=[16, 1], ...)) serve. The\n"
    "shapes feed the cost model (a recording run) and --verify, which runs the original\n"
    "and the rewritten version on random inputs (same RNG seed for both) and compares\n"
    "outputs and gradients (relative L2 <= 1e-4, non-finite values position by position).\n";

} // namespace

void print_help() {
  std::cout << kUsage << "POLICY (the cost model's options):\n";
  for (const memslim::PolicyOption& po : memslim::policy_options())
    std::cout << "  " << po.flag() << "=" << po.value_help << "  " << po.help << "\n";
}

void print_passes() {
  for (const auto& p : memslim::pass_table())
    std::cout << "  " << p.flag << " - " << p.summary << "\n";
  // Each pipeline as each front end runs it (core/pass_table.cpp gives the reasons).
  for (const auto& p : memslim::pipeline_table()) {
    std::cout << "  pipeline " << p.name << " - " << p.summary << ":";
    for (const auto& s : p.passes(memslim::FrontEnd::Jit)) std::cout << " " << s;
    std::cout << "; on .pt2 (FX):";
    for (const auto& s : p.passes(memslim::FrontEnd::Fx)) std::cout << " " << s;
    std::cout << "\n";
  }
}

} // namespace memslim_opt
