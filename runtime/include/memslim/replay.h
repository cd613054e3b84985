//===- replay.h - functions cut from a model, run again in backward --------===//
//
// What: what memslim's ops that re-run a piece of the user's model in backward
// share (coupling_chain: F and G of each coupling; recompute_block: a whole
// block): a function given as TorchScript IR text (block input first, then
// its external inputs), parsed and compiled once; which external inputs it
// writes in place (declared writes, and the running stats aten's batch_norm /
// instance_norm schemas leave undeclared), whether it draws random numbers,
// running it (replays get copies of what it writes, so module state moves once
// per step), and the generator-state replay that gives a re-run the forward's
// random numbers and then puts the user's stream back.
// Why shared: these are the hazards hand-written recompute code keeps hitting
// (memcnn #12: running stats updated twice; dropout replayed with another
// mask); solved once here, every op that replays gets the same answers.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memslim::replay {

struct Fn {
  std::shared_ptr<torch::jit::Graph> graph;
  std::unique_ptr<torch::jit::Code> code;
  std::vector<bool> written; // inputs the function writes in place (index 0: its data input)
  bool random = false;       // holds a random op: replays need the forward's RNG state
};

// Parses `text` (`outputs` Tensor outputs, at least one input) and compiles
// it; `op` and `which` name it in errors ("memslim::coupling_chain: cannot
// parse function 3: ...").
Fn parse_fn(const std::string& text, const char* op, const std::string& which, size_t outputs = 1);

// Runs `f` on `data`, its external inputs (undefined: None) and then `strs`
// (its str inputs). `replay`: the re-runs (backward, checks) get copies of
// what f writes in place. run_fn: its one output; run_fn_outputs: all.
at::Tensor run_fn(const Fn& f, const at::Tensor& data, const std::vector<at::Tensor>& ext,
                  bool replay, const char* op, const std::vector<std::string>& strs = {});
std::vector<at::Tensor> run_fn_outputs(const Fn& f, const at::Tensor& data,
                                       const std::vector<at::Tensor>& ext, bool replay,
                                       const char* op, const std::vector<std::string>& strs = {});

// The default generator state of `device` now, if `f` draws random numbers
// (undefined otherwise): what a replay of f must start from.
at::Tensor rng_state(const Fn& f, c10::Device device);

// The default generator of `device` set to `state` for the scope (nothing when
// `state` is undefined), put back after.
struct RngReplay {
  std::optional<at::Generator> gen;
  at::Tensor now;
  RngReplay(const at::Tensor& state, c10::Device device);
  ~RngReplay();
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;
};

// A `Tensor?[]` state argument as tensors (undefined: None).
std::vector<at::Tensor> state_vec(const c10::List<std::optional<at::Tensor>>& state);

// autograd::Function takes no undefined inputs: the defined entries of a state
// (`present`) and their indices among its `size` entries (`where`), and back.
struct PresentState {
  std::vector<at::Tensor> present;
  std::vector<int64_t> where;
  int64_t size = 0;
};
PresentState split_present(const std::vector<at::Tensor>& state);
std::vector<at::Tensor> join_present(at::TensorList present, const std::vector<int64_t>& where,
                                     int64_t size);

// Whether grad mode is on and `data` or a state entry requires grad.
bool needs_autograd(std::initializer_list<at::Tensor> data, const std::vector<at::Tensor>& state);

// A backward that re-runs and lets go as it goes (coupling_chain's walk):
// sole_owner(t): nothing but the caller's `t` refers to its memory (one
// reference to the tensor, one to its storage), so a sum may land in it;
// accumulate(acc, d): acc += d, in place where acc is sole_owner's and the sum
// keeps its size and dtype, else a new tensor; grad_from_edges: what
// torch::autograd::grad(allow_unused) computes, from the roots' graph edges,
// so the re-run's outputs need not be held while their backward runs.
bool sole_owner(const at::Tensor& t);
void accumulate(at::Tensor& acc, const at::Tensor& d);
std::vector<at::Tensor> grad_from_edges(const torch::autograd::edge_list& roots,
                                        const std::vector<at::Tensor>& cots,
                                        const std::vector<at::Tensor>& wrt);

} // namespace memslim::replay
