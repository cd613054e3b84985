//===- archives.cpp - TorchScript archives (.pt) in and out ---------------===//
//
// What: a .pt input loaded (first in a child process: probe_load), checked for
// consistency, every method rewritten by memslim::optimize, --verify on
// forward with module state put back between runs, and the archive (or
// forward's IR) written; write_atomically, which the IR path shares.
// Why the child: torch's reader dies with SIGSEGV or std::terminate on some
// corrupt archives (found by bench/fuzz_opt_inputs.py); the child's death
// becomes one error line here.
//
//===----------------------------------------------------------------------===//
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "inputs.h"
#include "memslim/core/statistics.h"
#include "memslim/jit/optimize.h"
#include "memslim/jit/validate_graph.h"
#include "memslim_opt.h"
#include "support.h"
#include "verify.h"

namespace memslim_opt {

bool is_archive(const std::string& path) {
  if (path == "-") return false;
  auto ends = [&](const std::string& s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (ends(".pt") || ends(".pth")) return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  return magic[0] == 'P' && magic[1] == 'K' && magic[2] == 3 && magic[3] == 4;
}

void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write) {
  const std::string tmp = path + ".tmp";
  g_partial_output = tmp;
  try {
    write(tmp);
  } catch (const std::exception& e) {
    fail("cannot write '" + path + "': " + one_line(e));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot write '" + path + "'");
  g_partial_output.clear();
}

namespace {

// torch::jit::load accepts some corrupted archives and fails later, deep in
// clone or save (torch's "INTERNAL ASSERT FAILED" texts): an attribute whose
// value does not fit its declared type, debug info (source ranges) read lazily.
// Touch both now; "" when the module is consistent.
std::string check_loaded(const torch::jit::Module& module, bool will_save) {
  for (const auto& m : module.modules()) {
    const auto obj = m._ivalue();
    const auto cls = obj->type();
    if (obj->slots().size() != cls->numAttributes())
      return "an object's attributes do not match its class";
    for (size_t i = 0; i < cls->numAttributes(); ++i) {
      const c10::IValue& v = obj->getSlot(i);
      if (!v.type()->isSubtypeOf(*cls->getAttribute(i)))
        return "attribute '" + cls->getAttributeName(i) + "' of " + cls->repr_str() + " holds a " +
               v.type()->repr_str() + ", declared " + cls->getAttribute(i)->repr_str();
    }
    for (const auto& method : m.get_methods()) {
      const auto graph = method.graph();
      (void)graph->toString(/*print_source_locations=*/true);
      if (auto bad = memslim::validate_graph(graph)) return "method " + method.name() + ": " + *bad;
    }
  }
  if (will_save) {
    // Saving reads what loading left lazy (debug info): do it once in memory.
    std::ostringstream sink;
    module.save(sink);
  }
  return "";
}

// One line for an exception from torch::jit::load or check_loaded.
std::string load_error(const std::exception& e) {
  const std::string msg = one_line(e);
  const std::string detail = torch_check_detail(msg);
  return detail.empty() ? msg : "inconsistent contents (" + detail + ")";
}

// The probe child's pipe to the parent (its terminate handler writes there).
int g_probe_fd = -1;

void write_all(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    const ssize_t k = ::write(fd, s.data() + at, s.size() - at);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    at += static_cast<size_t>(k);
  }
}

// torch's reader itself fails badly on some corrupt archives (found by
// bench/fuzz_opt_inputs.py): SIGSEGV deserializing the debug info of a code file
// that fails to parse, and an ErrorReport whose noexcept what() throws while it
// reads that debug info to quote the source (std::terminate). So the archive is
// loaded and checked in a child process first; the child sends back the one-line
// error, and a signal or a terminate there becomes one line here too. Returns ""
// when the archive loads (or the probe cannot run: then the load below reports).
std::string probe_load(const std::string& path, bool will_save) {
  std::cout.flush();
  std::cerr.flush();
  int fds[2];
  if (pipe(fds) != 0) return "";
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return "";
  }
  if (pid == 0) {
    close(fds[0]);
    g_probe_fd = fds[1];
    std::set_terminate([] {
      // Only c10::Error's text here: what() of anything else may throw again.
      write_all(g_probe_fd, "torch failed while describing the load error (" +
                                terminating_exception(/*c10_only=*/true) +
                                "): the archive is corrupt");
      _exit(1);
    });
    std::string msg;
    try {
      const auto m = torch::jit::load(path);
      msg = check_loaded(m, will_save);
    } catch (const std::exception& e) {
      msg = load_error(e);
    } catch (...) {
      msg = "unknown exception";
    }
    write_all(g_probe_fd, msg);
    _exit(msg.empty() ? 0 : 1);
  }
  close(fds[1]);
  std::string msg;
  char buf[4096];
  for (;;) {
    const ssize_t k = ::read(fds[0], buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    msg.append(buf, static_cast<size_t>(k));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return "";
  if (WIFSIGNALED(status))
    return "torch's reader crashed on it (" + std::string(strsignal(WTERMSIG(status))) +
           "): the archive is corrupt";
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) return msg.empty() ? "(no message)" : msg;
  return "";
}

// The archive at o.input, loaded and checked (probe_load first); fails with
// one line when it does not load.
torch::jit::Module load_archive(const Options& o) {
  torch::jit::Module module;
  std::string inconsistent = probe_load(o.input, !o.output.empty());
  if (!inconsistent.empty())
    fail("cannot load '" + o.input + "' as a TorchScript archive: " + inconsistent);
  try {
    module = torch::jit::load(o.input);
    inconsistent = check_loaded(module, !o.output.empty());
  } catch (const std::exception& e) {
    inconsistent = load_error(e);
  }
  if (!inconsistent.empty())
    fail("cannot load '" + o.input + "' as a TorchScript archive: " + inconsistent);
  return module;
}

// --input-shapes read against forward's signature (self left out).
Example forward_inputs(const torch::jit::Module& module, const Options& o) {
  auto fwd = module.find_method("forward");
  if (!fwd) fail("--input-shapes: the archive has no forward method");
  const auto& args = fwd->function().getSchema().arguments();
  std::vector<c10::TypePtr> types;
  std::vector<std::string> arg_names;
  for (size_t i = 1; i < args.size(); ++i) {
    types.push_back(args[i].type());
    arg_names.push_back("'" + args[i].name() + "'");
  }
  return inputs_from_specs(types, arg_names, o.input_specs);
}

// --verify on forward: both modules' state put back between runs; the float64
// reference runs a float64 clone of the module.
void verify_archive(const torch::jit::Module& module, const memslim::OptimizeResult& r,
                    const Example& ex) {
  std::vector<at::Tensor> params;
  for (const auto& p : module.parameters())
    if (p.requires_grad()) params.push_back(p);
  memslim::ModuleStateGuard keep_a(module), keep_b(r.module);
  const auto before = module.get_method("forward").graph();
  verify(
      before, r.module.get_method("forward").graph(), {module._ivalue()}, ex, params,
      [&] {
        keep_a.restore();
        keep_b.restore();
      },
      [&](bool rewritten) -> std::optional<RunResult> {
        torch::jit::Module m64 = (rewritten ? r.module : module).clone();
        m64.to(at::kDouble);
        std::vector<at::Tensor> p64;
        for (const auto& p : m64.parameters())
          if (p.requires_grad()) p64.push_back(p);
        if (p64.size() != params.size()) return std::nullopt;
        return run_with_grads(rewritten ? r.module.get_method("forward").graph() : before,
                              {m64._ivalue()}, in_double(ex), p64);
      });
}

} // namespace

int run_archive(const Options& o, const std::vector<std::string>& names) {
  torch::jit::Module module = load_archive(o);
  memslim::OptimizeOptions opts;
  opts.methods.clear();
  for (const auto& m : module.get_methods()) opts.methods.push_back(m.name());
  opts.passes = names;
  opts.policy = o.policy;
  opts.strict = o.verify;
  Example ex;
  if (!o.input_specs.empty()) {
    ex = forward_inputs(module, o);
    opts.example_inputs = ex.values;
  }
  if (o.verify && o.input_specs.empty()) fail("--verify needs --input-shapes");
  memslim::OptimizeResult r;
  try {
    r = memslim::optimize(module, opts);
  } catch (const std::exception& e) {
    fail(one_line(e));
  }
  if (o.remarks)
    for (const auto& d : r.decisions) std::cerr << d.render() << "\n";
  if (o.stats) std::cerr << memslim::render_statistics(memslim::pass_statistics(r.decisions));
  if (o.verify) verify_archive(module, r, ex);
  if (o.output.empty()) {
    std::cout << parseable(r.module.get_method("forward").graph()->toString());
    return 0;
  }
  write_atomically(o.output, [&](const std::string& tmp) { r.module.save(tmp); });
  return 0;
}

} // namespace memslim_opt
