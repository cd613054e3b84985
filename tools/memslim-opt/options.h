//===- options.h - memslim-opt's command line -------------------*- C++ -*-===//
//
// What: the parsed command line (Options), its parser, --help and
// --list-passes. Why apart: what the tool accepts reads in one place, away
// from what it does with it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

#include "memslim/jit/pass.h"

namespace memslim_opt {

struct Options {
  std::string input, output;
  std::vector<std::string> passes;
  std::string pipeline;
  bool list = false, remarks = false, stats = false, print_after_all = false, help = false,
       split = false;
  bool verify = false;
  std::vector<std::string> input_specs; // --input-shapes, one token per graph input
  memslim::CostPolicy policy;
};

// A size token of --input-shapes: "4x3x32x32" or "scalar".
bool is_shape_token(const std::string& t);

// argv -> Options; a bad flag fails with one line.
Options parse_args(int argc, char** argv);

// --help: the usage text, then the policy flags from passes/core/policy.cpp's table.
void print_help();

// --list-passes: every registered pass and pipeline.
void print_passes();

} // namespace memslim_opt
