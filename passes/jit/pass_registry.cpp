//===- pass_registry.cpp - the TorchScript front end's passes and driver ---===//
//
// What: the TorchScript implementation of each row of the core's pass table
// (core/pass_table.h: flags, summaries and pipelines are declared there once):
// run_swap_pass / run_formula_pass for every swap / formula row, the adapters
// of the others; and run_pass, which runs one pass as a transaction through a
// SafetyGate.
//
//===----------------------------------------------------------------------===//
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <stdexcept>

#include "memslim/core/pass_table.h"
#include "memslim/core/site_loop.h"
#include "memslim/jit/graph_iterator.h"
#include "memslim/jit/jit_graph_view.h"
#include "memslim/jit/pass.h"
#include "memslim/jit/safety_gate.h"

namespace memslim {

torch::jit::Node* replace_output(torch::jit::Graph& g, torch::jit::Node* old,
                                 torch::jit::Value* old_output, c10::Symbol kind,
                                 at::ArrayRef<torch::jit::Value*> inputs) {
  torch::jit::WithInsertPoint guard(old);
  torch::jit::Node* n = g.insertNode(g.create(kind, inputs, 1));
  n->output()->setType(old_output->type());
  n->output()->copyMetadata(old_output);
  old_output->replaceAllUsesWith(n->output());
  return n;
}

bool inside_loop(const torch::jit::Node* n) {
  for (const torch::jit::Block* b = n->owningBlock(); b->owningNode();
       b = b->owningNode()->owningBlock())
    if (b->owningNode()->kind() == c10::prim::Loop) return true;
  return false;
}

CostPolicy resolved(CostPolicy p) {
  // Measured (README, TransformerEncoder): with the executor's optimisations on,
  // scripted dropout keeps an (8,128,1024) bool mask where eager keeps float noise.
  if (p.dropout_mask_bytes < 0)
    p.dropout_mask_bytes = torch::jit::getGraphExecutorOptimize() ? 1 : 0;
  return p;
}

void run_swap_pass(const SwapRule& rule, const std::shared_ptr<torch::jit::Graph>& g,
                   PassContext& ctx) {
  const JitGraphView view(g);
  for_each_site(
      view, rule.is_site,
      [&](const GraphView& v, NodeRef n) { return rule.decide(v, n, ctx.policy); }, ctx.alive(),
      [&](NodeRef site, SwapDecision& d) {
        std::vector<torch::jit::Value*> guarded;
        for (ValueRef v : d.guarded) guarded.push_back(JitGraphView::value(v));
        ctx.gate->submit(
            swap_proposal(g, JitGraphView::node(site), d.kind, std::move(guarded), d.decision));
        return true;
      },
      ctx.record());
}

// A formula pass of the core's table (FormulaRule): the site becomes the
// decision's op with its arguments (constants inserted before the site), the
// covered nodes nobody reads any more go, through the SafetyGate.
void run_formula_pass(const FormulaRule& rule, const std::shared_ptr<torch::jit::Graph>& g,
                      PassContext& ctx) {
  const JitGraphView view(g);
  for_each_site(
      view, rule.is_site,
      [&](const GraphView& v, NodeRef n) { return rule.decide(v, n, ctx.policy); }, ctx.alive(),
      [&](NodeRef site, FormulaDecision& d) {
        Proposal prop;
        prop.site = d.decision.site;
        for (NodeRef c : d.covers) prop.covers.push_back(JitGraphView::node(c));
        for (ValueRef v : d.guarded) prop.guarded.push_back(JitGraphView::value(v));
        torch::jit::Node* root = JitGraphView::node(site);
        const std::vector<FormulaArg> args = d.args;
        const c10::Symbol op = c10::Symbol::fromQualString(d.op);
        // covered nodes that stay as another op (their old node, read by
        // nobody once swapped, goes with the covered nodes)
        std::vector<std::pair<torch::jit::Node*, c10::Symbol>> swaps;
        for (const FormulaSwap& s : d.swaps)
          swaps.emplace_back(JitGraphView::node(s.node), c10::Symbol::fromQualString(s.kind));
        prop.apply = [&g, root, args, op, swaps]() {
          std::vector<torch::jit::Value*> inputs;
          {
            torch::jit::WithInsertPoint guard(root);
            for (const FormulaArg& a : args)
              inputs.push_back(a.constant ? g->insertConstant(*a.constant)
                                          : JitGraphView::value(a.value));
          }
          replace_output(*g, root, root->output(), op, inputs);
          for (const auto& [n, kind] : swaps) replace_output(*g, n, n->output(), kind, n->inputs());
          return std::string();
        };
        prop.rewrote = d.decision.text;
        prop.price = d.decision.price;
        ctx.gate->submit(prop);
        return true;
      },
      ctx.record());
}

namespace {
// The TorchScript implementation of each row of the pass table (core/pass_table.h)
// whose rewrite is its own; a swap pass's row is the pass (run_swap_pass).
struct JitPass {
  const char* flag;
  void (*run)(const std::shared_ptr<torch::jit::Graph>&, PassContext&);
};
constexpr JitPass kJitPasses[] = {
    {"functionalize-inplace-activations", run_functionalize_inplace_activations},
    {"canonicalize-activations", run_canonicalize_activations},
    {"canonicalize-norms", run_canonicalize_norms},
    {"remove-identity-dropouts", run_remove_identity_dropouts},
    {"invertible-couplings", run_invertible_couplings},
    {"recompute-blocks", run_recompute_blocks},
    {"fuse-activation-dropout", run_fuse_activation_dropout},
    {"recompute-pointwise-regions", run_recompute_pointwise_regions},
    {"fuse-activation-consumer", run_fuse_activation_consumer},
    {"fuse-residual-join", run_fuse_residual_join},
    {"cleanup", run_cleanup},
    {"test-perturb-outputs", run_test_perturb_outputs},
};
} // namespace

const std::vector<PassInfo>& registered_passes() {
  // The table's rows, in its order, each with its TorchScript implementation;
  // a row without one is a build mistake caught on first use.
  static const std::vector<PassInfo> passes = [] {
    std::vector<PassInfo> out;
    for (const PassSpec& spec : pass_table()) {
      PassFn run = nullptr;
      for (const JitPass& j : kJitPasses)
        if (std::string(j.flag) == spec.flag) run = j.run;
      if (spec.swap.decide) {
        const SwapRule rule = spec.swap;
        run = [rule](const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
          run_swap_pass(rule, g, ctx);
        };
      }
      if (spec.formula.decide) {
        const FormulaRule rule = spec.formula;
        run = [rule](const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
          run_formula_pass(rule, g, ctx);
        };
      }
      if (!run)
        throw std::logic_error(std::string("pass ") + spec.flag + " has no TorchScript form");
      out.push_back({spec.flag, spec.summary, run});
    }
    return out;
  }();
  return passes;
}

const std::vector<PipelineInfo>& registered_pipelines() {
  static const std::vector<PipelineInfo> pipelines = [] {
    std::vector<PipelineInfo> out;
    for (const PipelineSpec& p : pipeline_table())
      out.push_back({p.name, p.summary, p.passes(FrontEnd::Jit)});
    return out;
  }();
  return pipelines;
}

std::vector<const PassInfo*> resolve_plan(const std::vector<std::string>& passes,
                                          const std::string& pipeline) {
  std::vector<std::string> names = passes;
  if (names.empty()) {
    const PipelineInfo* pl = find_pipeline(pipeline);
    if (!pl) throw std::invalid_argument("unknown pipeline '" + pipeline + "'");
    names = pl->passes;
  }
  std::vector<const PassInfo*> plan;
  for (const auto& n : names) {
    const PassInfo* p = find_pass(n);
    if (!p) throw std::invalid_argument("unknown pass '" + n + "'");
    plan.push_back(p);
  }
  return plan;
}

void run_pass(const PassInfo& p, const std::shared_ptr<torch::jit::Graph>& g, PassContext& ctx) {
  const size_t remarks_before = ctx.remarks.size();
  std::shared_ptr<torch::jit::Graph> snapshot = g->copy();
  SafetyGate gate(g, p.flag, ctx.remarks);
  SafetyGate* outer = ctx.gate;
  ctx.gate = &gate;
  try {
    p.run(g, ctx);
    g->lint();
    ctx.gate = outer;
  } catch (const std::exception& e) {
    ctx.gate = outer;
    if (ctx.strict) throw;
    restore_graph(*g, *snapshot);
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    ctx.remarks.truncate(remarks_before);
    ctx.remarks.add({p.flag, Decision::Verdict::RolledBack, "", what, {}});
  }
}

std::function<bool(NodeRef)> PassContext::alive() const {
  return [gate = gate](NodeRef n) { return gate->alive(JitGraphView::node(n)); };
}

std::function<void(Decision)> PassContext::record() {
  return [this](Decision d) { remarks.add(std::move(d)); };
}

const PassInfo* find_pass(const std::string& flag) {
  for (const auto& p : registered_passes())
    if (flag == p.flag) return &p;
  return nullptr;
}

const PipelineInfo* find_pipeline(const std::string& name) {
  for (const auto& p : registered_pipelines())
    if (name == p.name) return &p;
  return nullptr;
}

} // namespace memslim
