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
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/script.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "memslim/passes/optimize.h"
#include "memslim/passes/pass.h"

namespace {

struct Options {
  std::string input, output;
  std::vector<std::string> passes;
  std::string pipeline;
  bool list = false, remarks = false, print_after_all = false, help = false, split = false;
  bool verify = false;
  std::vector<std::vector<int64_t>> input_shapes;
  memslim::CostPolicy policy;
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

// "4x3x32x32,16" -> {{4, 3, 32, 32}, {16}}
std::vector<std::vector<int64_t>> parse_shapes(const std::string& spec) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& one : split(spec, ',')) {
    std::vector<int64_t> dims;
    for (const auto& d : split(one, 'x')) {
      char* end = nullptr;
      const long long v = std::strtoll(d.c_str(), &end, 10);
      if (end == d.c_str() || *end != '\0' || v < 0)
        fail("bad --input-shapes '" + spec + "': expected sizes like 4x3x32x32,16");
      dims.push_back(v);
    }
    shapes.push_back(dims);
  }
  if (shapes.empty()) fail("bad --input-shapes '" + spec + "': expected sizes like 4x3x32x32,16");
  return shapes;
}

double parse_number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || d < 0) fail("bad value in '" + flag + "': expected a number >= 0");
  return d;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") o.help = true;
    else if (a == "--list-passes") o.list = true;
    else if (a == "--remarks") o.remarks = true;
    else if (a == "--print-ir-after-all") o.print_after_all = true;
    else if (a == "--split-input-file") o.split = true;
    else if (a == "--verify") o.verify = true;
    else if (starts_with(a, "--input-shapes=")) o.input_shapes = parse_shapes(a.substr(15));
    else if (starts_with(a, "--min-bytes=")) o.policy.min_bytes = parse_number(a, a.substr(12));
    else if (starts_with(a, "--max-added-work=")) o.policy.max_added_work = parse_number(a, a.substr(17));
    else if (starts_with(a, "--assume-numel=")) o.policy.assume_numel = int64_t(parse_number(a, a.substr(15)));
    else if (starts_with(a, "--dropout-mask-bytes=")) o.policy.dropout_mask_bytes = int(parse_number(a, a.substr(21)));
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
    "                   [--input-shapes=AxB,C] [--verify] [--print-ir-after-all]\n"
    "                   [--split-input-file] [--list-passes]\n"
    "                   [--min-bytes=N] [--max-added-work=W] [--assume-numel=N]\n"
    "                   [--dropout-mask-bytes=0|1]  (0: eager autograd's float noise;\n"
    "                   1: the bool mask TorchScript's optimising executor keeps; default 1)\n"
    "INPUT: TorchScript IR text (.ir, or - for stdin) or a TorchScript archive (.pt: every\n"
    "method is rewritten, -o writes an archive that torch.jit.load reads once memslim is\n"
    "imported). --input-shapes: fp32 shapes of the graph's (or forward's) tensor inputs, for\n"
    "the cost model (a recording run) and for --verify, which runs the original and the\n"
    "rewritten version on random inputs and compares outputs and gradients.\n";

std::vector<at::Tensor> random_inputs(const std::vector<std::vector<int64_t>>& shapes) {
  at::manual_seed(0);
  std::vector<at::Tensor> out;
  for (const auto& s : shapes) out.push_back(at::randn(s));
  return out;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double na = a.to(at::kDouble).norm().item<double>();
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() / (na > 0 ? na : 1.0);
}

// Runs `graph` on `prefix` + `tensors` (made to require grad) with autograd,
// returning the tensor outputs and d(sum_i <w_i, out_i>)/d(tensors, params).
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> run_with_grads(
    const std::shared_ptr<torch::jit::Graph>& graph, const std::vector<c10::IValue>& prefix,
    const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> leaves;
  torch::jit::Stack stack(prefix.begin(), prefix.end());
  for (const auto& t : tensors) {
    leaves.push_back(t.detach().clone().requires_grad_(true));
    stack.emplace_back(leaves.back());
  }
  torch::jit::Code code(graph, "memslim_verify");
  torch::jit::InterpreterState(code).run(stack);
  std::vector<at::Tensor> outs;
  at::Tensor loss;
  at::manual_seed(1);
  for (const auto& v : stack) {
    if (!v.isTensor()) continue;
    outs.push_back(v.toTensor().detach());
    if (!v.toTensor().requires_grad()) continue;
    at::Tensor term = (v.toTensor() * at::randn_like(v.toTensor())).sum();
    loss = loss.defined() ? loss + term : term;
  }
  std::vector<at::Tensor> wrt = leaves;
  wrt.insert(wrt.end(), params.begin(), params.end());
  std::vector<at::Tensor> grads;
  if (loss.defined()) {
    for (auto& g : torch::autograd::grad({loss}, wrt, {}, std::nullopt, false, true))
      grads.push_back(g.defined() ? g : at::Tensor());
  }
  return {outs, grads};
}

void verify(const std::shared_ptr<torch::jit::Graph>& before,
            const std::shared_ptr<torch::jit::Graph>& after, const std::vector<c10::IValue>& prefix,
            const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& params) {
  auto [o1, g1] = run_with_grads(before, prefix, tensors, params);
  auto [o2, g2] = run_with_grads(after, prefix, tensors, params);
  double worst_out = 0, worst_grad = 0;
  if (o1.size() != o2.size() || g1.size() != g2.size()) fail("verify: outputs differ in number");
  for (size_t i = 0; i < o1.size(); ++i) worst_out = std::max(worst_out, rel_diff(o1[i], o2[i]));
  for (size_t i = 0; i < g1.size(); ++i)
    if (g1[i].defined() && g2[i].defined()) worst_grad = std::max(worst_grad, rel_diff(g1[i], g2[i]));
  std::ostringstream msg;
  msg << "outputs within " << worst_out << ", gradients within " << worst_grad
      << " (relative L2; bar 1e-4)";
  if (worst_out > 1e-4 || worst_grad > 1e-4) fail("verify failed: " + msg.str());
  std::cerr << "memslim-opt: verify: ok: " << msg.str() << "\n";
}

bool is_archive(const std::string& path) {
  if (path == "-") return false;
  if (path.size() > 3 && (path.substr(path.size() - 3) == ".pt" || path.substr(path.size() - 4) == ".pth"))
    return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  return magic[0] == 'P' && magic[1] == 'K' && magic[2] == 3 && magic[3] == 4;
}

void write_atomically(const std::string& path, const std::function<void(const std::string&)>& write) {
  const std::string tmp = path + ".tmp";
  try {
    write(tmp);
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    fail("cannot write '" + path + "': " + first_line(e.what()));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("cannot write '" + path + "'");
  }
}

int run_archive(const Options& o, const std::vector<std::string>& names) {
  torch::jit::Module module;
  try {
    module = torch::jit::load(o.input);
  } catch (const std::exception& e) {
    fail("cannot load '" + o.input + "' as a TorchScript archive: " + first_line(e.what()));
  }
  memslim::OptimizeOptions opts;
  opts.methods.clear();
  for (const auto& m : module.get_methods()) opts.methods.push_back(m.name());
  opts.passes = names;
  opts.policy = o.policy;
  opts.strict = o.verify;
  opts.example_inputs = random_inputs(o.input_shapes);
  memslim::OptimizeResult r;
  try {
    r = memslim::optimize(module, opts);
  } catch (const std::exception& e) {
    fail(first_line(e.what()));
  }
  if (o.remarks)
    for (const auto& line : r.remarks) std::cerr << line << "\n";
  if (o.verify) {
    if (o.input_shapes.empty()) fail("--verify needs --input-shapes");
    std::vector<at::Tensor> params;
    for (const auto& p : module.parameters())
      if (p.requires_grad()) params.push_back(p);
    verify(module.get_method("forward").graph(), r.module.get_method("forward").graph(),
           {module._ivalue()}, opts.example_inputs, params);
  }
  if (o.output.empty()) {
    std::cout << r.module.get_method("forward").graph()->toString();
    return 0;
  }
  write_atomically(o.output, [&](const std::string& tmp) { r.module.save(tmp); });
  return 0;
}

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

  if (is_archive(o.input)) return run_archive(o, names);
  if (!o.input_shapes.empty() || o.verify) {
    if (o.input_shapes.empty()) fail("--verify needs --input-shapes");
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
    std::shared_ptr<torch::jit::Graph> original;
    std::vector<at::Tensor> example;
    if (!o.input_shapes.empty()) {
      example = random_inputs(o.input_shapes);
      std::vector<c10::IValue> inputs(example.begin(), example.end());
      try {
        memslim::record_shapes(graph, inputs);
      } catch (const std::exception& e) {
        fail("--input-shapes: " + first_line(e.what()));
      }
      original = graph->copy();
    }
    memslim::PassContext ctx;
    ctx.policy = o.policy;
    ctx.strict = o.verify;
    try {
      for (const auto* p : plan) {
        memslim::run_pass(*p, graph, ctx);
        if (o.print_after_all)
          std::cerr << "// -----// IR after " << p->flag << " //----- //\n" << graph->toString();
      }
    } catch (const std::exception& e) {
      fail(std::string("pass failed: ") + first_line(e.what()));
    }
    if (o.remarks)
      for (const auto& r : ctx.remarks.lines()) std::cerr << r << "\n";
    if (o.verify) verify(original, graph, {}, example, {});
    if (c > 0) result += "// -----\n";
    result += graph->toString();
  }

  if (o.output.empty()) {
    std::cout << result;
    return 0;
  }
  write_atomically(o.output, [&](const std::string& tmp) {
    std::ofstream out(tmp);
    if (!out || !(out << result)) throw std::runtime_error("write failed");
  });
  return 0;
}
