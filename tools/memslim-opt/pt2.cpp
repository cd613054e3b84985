//===- pt2.cpp - .pt2 input: the hand-over to python -m memslim.opt_pt2 ---===//
//
// What: finds a .pt2 (torch.export archive) among the arguments and makes this
// process `python -m memslim.opt_pt2 ARGS...` (this build's interpreter, or
// $MEMSLIM_PYTHON). Why: the FX front end lives in Python (memslim.fx); the
// decisions are the same C++ core, reached through memslim._C.
//
//===----------------------------------------------------------------------===//
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "memslim_opt.h"

namespace memslim_opt {

// A torch.export archive (INPUT ending in .pt2) goes to the FX front end, which
// lives in Python: this process becomes `python -m memslim.opt_pt2 ARGS...`.
int exec_pt2(int argc, char** argv) {
  const char* env = std::getenv("MEMSLIM_PYTHON");
  const std::string python = env && *env ? env : MEMSLIM_PYTHON;
  std::vector<std::string> args = {python, "-m", "memslim.opt_pt2"};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execv(python.c_str(), cargs.data());
  std::fprintf(stderr, "memslim-opt: error: .pt2 input needs Python with memslim (%s): %s\n",
               python.c_str(), std::strerror(errno));
  return 1;
}

bool has_pt2_input(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-o") {
      ++i; // the output's name, not an input
      continue;
    }
    if (a.size() > 4 && a.compare(a.size() - 4, 4, ".pt2") == 0 && a[0] != '-') return true;
  }
  return false;
}

} // namespace memslim_opt
