//===- executor_hook.h - memslim in torch.jit's custom pass hooks -----------===//
#pragma once

#include <cstdint>

#include "memslim/jit/pass.h"

namespace memslim {

// Registers the memslim-default pipeline as a torch.jit pre-pass and
// post-pass (idempotent). See the README for which executor modes run them.
void registerWithGraphExecutor();
void unregisterFromGraphExecutor();

struct ExecutorHookStats {
  int64_t pre_runs, post_runs, rewrites;
};
ExecutorHookStats executorHookStats();
void resetExecutorHookStats();

} // namespace memslim
