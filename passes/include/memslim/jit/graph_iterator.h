// torch/csrc/jit/runtime/graph_iterator.h has no include guard; this wrapper has one, so
// that files compiled together in one unity batch (passes/CMakeLists.txt) may each
// include it.
#pragma once

#include <torch/csrc/jit/runtime/graph_iterator.h>
