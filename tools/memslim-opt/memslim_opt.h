//===- memslim_opt.h - the parts of memslim-opt that main.cpp calls -*- C++ -*-===//
//
// What: the entry points of each part of the tool: the two TorchScript input
// kinds (IR text, archives), writing the result, the fork server and the
// hand-over of .pt2 input to Python. Why one header: main.cpp's dispatch reads
// as a table of contents; each part's own helpers stay in its file.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "memslim/jit/pass.h"
#include "options.h"

namespace memslim_opt {

// memslim-opt as a process, from its arguments to its exit code (main.cpp).
int tool_main(int argc, char** argv);

// IR text input (a file or `-`, one case or --split-input-file's cases):
// parse, example inputs, passes, --verify, print or write (ir_text.cpp).
int run_ir(const Options& o, const std::vector<const memslim::PassInfo*>& plan);

// Graph::toString's text as parseIR reads it back (ir_text.cpp).
std::string parseable(const std::string& ir);

// TorchScript archive input (archives.cpp): by name or by the zip magic.
bool is_archive(const std::string& path);
int run_archive(const Options& o, const std::vector<std::string>& names);

// Writes `path` through `write(tmp)` on path + ".tmp", then renames: no output
// file unless every step succeeded (archives.cpp).
void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write);

// `memslim-opt --fork-server` (fork_server.cpp).
int fork_server();

// .pt2 input: this process becomes `python -m memslim.opt_pt2 ARGS` (pt2.cpp).
bool has_pt2_input(int argc, char** argv);
int exec_pt2(int argc, char** argv);

} // namespace memslim_opt
