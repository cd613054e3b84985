//===- region_ir.h - a recompute region as its op's TorchScript IR text ----===//
//
// What: the text memslim::recompute_region carries and parses at run time,
// built from a region the core decided on (core/recompute_regions.h). Why in
// the FX front end: the text is TorchScript IR (the op's contract), built and
// checked with torch::jit's parser, which the core does not include; the
// TorchScript front end clones the region from its own graph instead.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>

#include "memslim/core/recompute_regions.h"

namespace memslim {

// The region as the TorchScript graph text memslim::recompute_region runs
// (inputs in `r.inputs` order, outputs in `r.outputs` order, constants copied
// in), checked to parse back and to resolve every op; nullopt with `error`
// set when it does not (the region is then kept).
std::optional<std::string> region_ir(const GraphView& g, const Region& r, std::string* error);

} // namespace memslim
