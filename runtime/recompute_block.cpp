//===- recompute_block.cpp - a block that keeps only its inputs ------------===//
//
// What: memslim::recompute_block(Tensor x, Tensor?[] state, str fn, str[] strs)
// runs `fn`, a piece of the user's model cut out as TorchScript IR text (what
// recompute-blocks and the memory-budget planner cut: a residual block, a
// transformer sub-layer, a run of them) taking (x, state...) and returning one
// Tensor (its str reads, `strs`, its last inputs). Under autograd it keeps x
// and the state it reads (parameters, a mask: alive anyway) instead of every
// intermediate of the block; backward re-runs fn with grad on detached copies
// and differentiates it with torch::autograd::grad: what
// torch.utils.checkpoint does by hand, with its hazards met once (replay.h):
// BatchNorm's running stats move once per step (replays write copies), dropout
// replays the forward's mask (generator state replayed, then put back: the
// user's stream is not shifted).
// Why a `str`: as for recompute_region / coupling_chain, text survives
// printing, torch.jit.save / load and memslim-opt round trips; each text is
// parsed once per process and cached.
//
//===----------------------------------------------------------------------===//
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

#include "memslim/replay.h"

namespace memslim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kBlockOp = "memslim::recompute_block";
using replay::state_vec;

struct Block {
  int64_t id = 0;
  replay::Fn fn;
};

std::mutex g_blocks_mu;
std::vector<std::shared_ptr<const Block>>& blocks() {
  static std::vector<std::shared_ptr<const Block>> all;
  return all;
}

std::shared_ptr<const Block> block_for(const std::string& text) {
  static std::unordered_map<std::string, std::shared_ptr<const Block>> cache;
  std::lock_guard<std::mutex> lock(g_blocks_mu);
  auto it = cache.find(text);
  if (it != cache.end()) return it->second;
  auto b = std::make_shared<Block>();
  b->fn = replay::parse_fn(text, kBlockOp, "its function");
  b->id = int64_t(blocks().size());
  blocks().push_back(b);
  cache.emplace(text, b);
  return b;
}

std::shared_ptr<const Block> block_by_id(int64_t id) {
  std::lock_guard<std::mutex> lock(g_blocks_mu);
  return blocks().at(size_t(id));
}

// The schema promises a fresh result: a function returning (a view of) an
// input gets a copy.
at::Tensor fresh(at::Tensor y, const at::Tensor& x, const std::vector<at::Tensor>& state) {
  auto shares = [&](const at::Tensor& t) {
    return t.defined() && t.has_storage() && y.has_storage() &&
           t.storage().is_alias_of(y.storage());
  };
  bool alias = shares(x);
  for (const auto& t : state) alias = alias || shares(t);
  return alias ? y.clone() : y;
}

// The function takes (x, state..., strs...): the counts, and str exactly where
// the strs go (the interpreter would misread a str given for a Tensor).
void check_arity(const Block& b, size_t state, size_t strs) {
  const auto& in = b.fn.graph->inputs();
  TORCH_CHECK(state + strs + 1 == in.size(), kBlockOp, ": its function takes ", in.size() - 1,
              " state inputs, got ", state, " tensors and ", strs, " strs");
  for (size_t i = 1; i < in.size(); ++i)
    TORCH_CHECK((in[i]->type()->kind() == c10::TypeKind::StringType) == (i > state), kBlockOp,
                ": its function's input ", i, " is ", in[i]->type()->str(), " where the op gives ",
                i > state ? "a str" : "a state tensor");
}

at::Tensor run_plain(const Block& b, const at::Tensor& x, const std::vector<at::Tensor>& state,
                     const std::vector<std::string>& strs) {
  return fresh(replay::run_fn(b.fn, x, state, /*replay=*/false, kBlockOp, strs), x, state);
}

std::vector<std::string> str_vec(const std::optional<c10::List<std::string>>& strs) {
  if (!strs) return {};
  return std::vector<std::string>(strs->begin(), strs->end());
}

struct RecomputeBlockFunction : public torch::autograd::Function<RecomputeBlockFunction> {
  // `present`: the defined entries of the state (autograd takes no undefined
  // inputs), `where` their indices among its `size` entries (None elsewhere).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList present,
                               const std::string& fn, const std::vector<int64_t>& where,
                               int64_t size, const std::vector<std::string>& strs) {
    std::shared_ptr<const Block> b = block_for(fn);
    const std::vector<at::Tensor> state = replay::join_present(present, where, size);
    check_arity(*b, state.size(), strs.size());
    const at::Tensor rng = replay::rng_state(b->fn, x.device());
    at::Tensor y;
    {
      at::NoGradGuard no_grad;
      y = run_plain(*b, x, state, strs);
    }
    // What backward reads: x and the state, saved as eager's ops save them,
    // except what the function writes (BatchNorm's running stats, which the
    // next forward updates in place and replays copy anyway): no version check.
    std::vector<at::Tensor> saved{x}, unversioned(state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      if (b->fn.written[i + 1] && state[i].defined())
        unversioned[i] = state[i];
      else
        saved.push_back(state[i]);
    }
    ctx->saved_data["block"] = b->id;
    ctx->saved_data["rng"] = rng;
    ctx->saved_data["where"] = where;
    ctx->saved_data["unversioned"] = unversioned;
    ctx->saved_data["strs"] = c10::List<std::string>(strs);
    ctx->save_for_backward(saved);
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(), kBlockOp,
                ": double backward is not supported (the block is differentiated on a replay); "
                "keep such code out of the optimized model");
    std::shared_ptr<const Block> b = block_by_id(ctx->saved_data["block"].toInt());
    const at::Tensor rng = ctx->saved_data["rng"].toTensor();
    const auto where = ctx->saved_data["where"].toIntVector();
    std::vector<at::Tensor> state = ctx->saved_data["unversioned"].toTensorVector();
    const variable_list saved = ctx->get_saved_variables();
    {
      size_t next = 1;
      for (size_t i = 0; i < state.size(); ++i)
        if (!state[i].defined()) state[i] = saved.at(next++); // saved after x, in order
    }
    std::vector<size_t> slot(state.size(), 0); // state index -> autograd input index
    for (size_t i = 0; i < where.size(); ++i) slot[size_t(where[i])] = 1 + i;
    variable_list result(1 + where.size() + 4); // + fn, where, size, strs
    std::vector<at::Tensor> wrt, ext;
    std::vector<size_t> wrt_at; // result index per wrt entry
    at::Tensor x = saved[0].detach();
    if (ctx->needs_input_grad(0)) {
      x.requires_grad_(true);
      wrt.push_back(x);
      wrt_at.push_back(0);
    }
    for (size_t i = 0; i < state.size(); ++i) {
      const at::Tensor& t = state[i];
      if (t.defined() && slot[i] && ctx->needs_input_grad(slot[i])) {
        ext.push_back(t.detach().requires_grad_(true));
        wrt.push_back(ext.back());
        wrt_at.push_back(slot[i]);
      } else {
        ext.push_back(t.defined() ? t.detach() : t);
      }
    }
    if (wrt.empty() || !grads[0].defined()) return result;
    at::Tensor y;
    {
      at::AutoGradMode grad_mode(true);
      replay::RngReplay keep(rng, x.device());
      y = replay::run_fn(
          b->fn, x, ext, /*replay=*/true, kBlockOp,
          str_vec(c10::impl::toTypedList<std::string>(ctx->saved_data["strs"].toList())));
    }
    if (!y.requires_grad()) return result;
    auto d = torch::autograd::grad({y}, wrt, {grads[0]}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < wrt.size(); ++k) result[wrt_at[k]] = d[k];
    return result;
  }
};

at::Tensor recompute_block_plain(const at::Tensor& x,
                                 const c10::List<std::optional<at::Tensor>>& state,
                                 c10::string_view fn,
                                 const std::optional<c10::List<std::string>>& strs) {
  std::shared_ptr<const Block> b = block_for(std::string(fn));
  const std::vector<at::Tensor> s = state_vec(state);
  const std::vector<std::string> sv = str_vec(strs);
  check_arity(*b, s.size(), sv.size());
  return run_plain(*b, x, s, sv);
}

at::Tensor recompute_block_autograd(const at::Tensor& x,
                                    const c10::List<std::optional<at::Tensor>>& state,
                                    c10::string_view fn,
                                    const std::optional<c10::List<std::string>>& strs) {
  const std::vector<at::Tensor> s = state_vec(state);
  if (replay::needs_autograd({x}, s)) {
    const replay::PresentState p = replay::split_present(s);
    return RecomputeBlockFunction::apply(x, at::TensorList(p.present), std::string(fn), p.where,
                                         p.size, str_vec(strs))[0];
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return recompute_block_plain(x, state, fn, strs);
}

} // namespace

TORCH_LIBRARY_IMPL(memslim, Autograd, m) {
  m.impl("recompute_block", TORCH_FN(recompute_block_autograd));
}

// Every backend: the function's own aten ops do the work.
TORCH_LIBRARY_IMPL(memslim, CompositeExplicitAutograd, m) {
  m.impl("recompute_block", TORCH_FN(recompute_block_plain));
}

} // namespace memslim
