//===- executor_hook.cpp - memslim in torch.jit's custom pass hooks ---------===//
//
// What: registers the memslim-default pipeline as a torch.jit pre- and
// post-pass (torch/csrc/jit/passes/pass_manager.h), counting how often each
// runs and how many sites it rewrote. Why both and why counted: which executor
// modes call these hooks, on which graph, decides whether the hook can change
// what training saves; test/python/test_executor_hook.py measures it and the
// README states the table. memslim.optimize (ahead of time) is the path that
// works for training.
//
//===----------------------------------------------------------------------===//
#include "memslim/jit/executor_hook.h"

#include <torch/csrc/jit/passes/pass_manager.h>

#include <atomic>
#include <mutex>

namespace memslim {

namespace {

std::atomic<int64_t> g_pre_runs{0}, g_post_runs{0}, g_rewrites{0};
std::mutex g_mutex;
bool g_registered = false;
torch::jit::GraphPassNameType g_pre_id = 0, g_post_id = 0;

void run_pipeline(std::shared_ptr<torch::jit::Graph>& graph) {
  const PipelineInfo* pl = find_pipeline("memslim-default");
  PassContext ctx;
  for (const auto& name : pl->passes) run_pass(*find_pass(name), graph, ctx);
  for (const Decision& d : ctx.remarks.decisions())
    if (d.verdict == Decision::Verdict::Rewrote) ++g_rewrites;
}

} // namespace

void registerWithGraphExecutor() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_registered) return;
  g_pre_id = torch::jit::registerPrePass([](std::shared_ptr<torch::jit::Graph>& g) {
    ++g_pre_runs;
    run_pipeline(g);
  });
  g_post_id = torch::jit::registerPostPass([](std::shared_ptr<torch::jit::Graph>& g) {
    ++g_post_runs;
    run_pipeline(g);
  });
  g_registered = true;
}

void unregisterFromGraphExecutor() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_registered) return;
  torch::jit::clearPrePass(g_pre_id);
  torch::jit::clearPostPass(g_post_id);
  g_registered = false;
}

ExecutorHookStats executorHookStats() { return {g_pre_runs, g_post_runs, g_rewrites}; }

void resetExecutorHookStats() { g_pre_runs = g_post_runs = g_rewrites = 0; }

} // namespace memslim
