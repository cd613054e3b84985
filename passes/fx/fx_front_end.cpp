//===- fx_front_end.cpp - memslim's passes over an aten-level FX graph -----===//
#include "memslim/fx/fx_front_end.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <unordered_set>

#include "memslim/core/canonicalize.h"
#include "memslim/core/canonicalize_norms.h"
#include "memslim/core/couplings.h"
#include "memslim/core/functionalize.h"
#include "memslim/core/fuse_act_consumer.h"
#include "memslim/core/fuse_dropout.h"
#include "memslim/core/pass_table.h"
#include "memslim/core/recompute_blocks.h"
#include "memslim/core/recompute_regions.h"
#include "memslim/core/residual_join.h"
#include "memslim/core/site_loop.h"
#include "memslim/fx/region_ir.h"
#include "memslim/fx/view_gate.h"

namespace memslim {

namespace {

// A Rewrote decision the gate refused (`why` not empty) becomes Kept with the
// gate's reason; returns whether it did.
bool refused(Decision& d, const std::string& why) {
  if (why.empty()) return false;
  d.verdict = Decision::Verdict::Kept;
  d.text = why;
  return true;
}
// The same for a gate's refusal, which names its rule (core/gate_rules.h).
bool refused(Decision& d, const std::optional<Refusal>& why) {
  if (!why) return false;
  d.rule = why->rule;
  return refused(d, why->reason);
}

// for_each_site's `alive` and `record` in this front end (core/site_loop.h): a
// node is alive until a rewrite erases it; decisions go to the result.
std::function<bool(NodeRef)> alive(const FxGraphView& g) {
  return [&g](NodeRef n) { return !g.erased(n); };
}
std::function<void(Decision)> record(FxResult& out) {
  return [&out](Decision d) { out.decisions.push_back(std::move(d)); };
}

// Node `n` becomes `kind` (its default overload) with the same arguments, in
// the view (later decisions see the graph as it will be: the new op's schema
// too, so a functionalized silu_ joins a region as TorchScript's silu does) and
// in the rewrites handed back.
void apply_or_keep(FxGraphView& g, NodeRef n, Decision& d, const std::string& kind,
                   const std::optional<Refusal>& why, FxResult& out) {
  if (refused(d, why)) return;
  std::vector<size_t> inputs;
  for (size_t i = 0; i < g.num_inputs(n); ++i) inputs.push_back(g.id(g.input(n, i)));
  g.rewrite_node(g.id(n), kind, "", inputs);
  out.rewrites.push_back({g.id(n), kind, "", std::nullopt, {}, std::nullopt});
}

// A new constant value in the view (an argument a rewrite adds).
size_t add_constant(FxGraphView& g, c10::IValue c, const std::string& name) {
  FxGraphView::Value v;
  v.name = name;
  v.constant = std::move(c);
  return g.add_value(std::move(v));
}

// A formula (`covers`, producers first, ending at `root`) replaced by
// `op`(`inputs`) at `root`: in the view, then the covered nodes nobody reads
// any more go (consumers first); the rewrite handed back carries the new
// arguments (constants by value) and the erased nodes.
const FxRewrite& replace_formula(FxGraphView& g, NodeRef root, const std::string& op,
                                 const std::vector<size_t>& inputs,
                                 const std::vector<NodeRef>& covers, FxResult& out) {
  FxRewrite rw{g.id(root), op, "", std::vector<FxArg>{}, {}, std::nullopt};
  for (size_t v : inputs) {
    const auto c = g.constant(g.value_ref(v));
    rw.args->push_back(c ? FxArg{std::nullopt, *c} : FxArg{v, {}});
  }
  g.rewrite_node(g.id(root), op, "", inputs);
  for (auto it = covers.rbegin(); it != covers.rend(); ++it) {
    if (*it == root) continue;
    // torch.export's metadata asserts on a formula's intermediates (after its
    // `.to()` calls) read them without needing them: they go with the formula.
    std::vector<NodeRef> asserts;
    bool used = false;
    for (size_t o = 0; o < g.num_outputs(*it); ++o)
      for (const Use& u : g.uses(g.output(*it, o))) {
        if (g.kind(u.user) == "aten::_assert_tensor_metadata" && g.num_outputs(u.user) <= 1)
          asserts.push_back(u.user);
        else
          used = true;
      }
    if (used) continue;
    for (NodeRef a : asserts) {
      rw.erased.push_back(g.id(a));
      g.erase_node(g.id(a));
    }
    rw.erased.push_back(g.id(*it));
    g.erase_node(g.id(*it));
  }
  out.rewrites.push_back(std::move(rw));
  return out.rewrites.back();
}

// canonicalize-activations: a hand-written formula's root becomes the aten op
// of its input; the formula's nodes nobody reads any more go.
void canonicalize(FxGraphView& g, FxResult& out) {
  const ViewGate gate(g);
  std::unordered_set<size_t> gone;
  for (NodeRef root : canonicalize_roots(g)) {
    if (gone.count(g.id(root))) continue;
    auto d = decide_canonicalize(g, root);
    if (!d) continue;
    if (d->rewrite()) {
      std::optional<Refusal> why = gate.refusal_between(d->covers);
      if (!why) why = gate.refusal(root, {d->x, g.output(root, 0)});
      if (!refused(d->decision, why)) {
        std::vector<size_t> inputs{g.id(d->x)};
        if (!d->approximate.empty())
          inputs.push_back(
              add_constant(g, c10::IValue(d->approximate), "'" + d->approximate + "'"));
        for (size_t n : replace_formula(g, root, d->op, inputs, d->covers, out).erased)
          gone.insert(n);
      }
    }
    out.decisions.push_back(std::move(d->decision));
  }
}

// canonicalize-norms: a hand-written RMSNorm's / LayerNorm's last node becomes
// aten::rms_norm(x, [D], weight, eps) / aten::layer_norm(x, [D], weight, bias,
// eps); the formula's nodes nobody reads go. Last first, as the TorchScript
// pass: a LayerNorm's bias add is matched before the mul inside it.
void canonicalize_norms(FxGraphView& g, FxResult& out) {
  std::unordered_set<size_t> gone;
  std::vector<NodeRef> roots = g.nodes();
  std::reverse(roots.begin(), roots.end());
  for (NodeRef root : roots) {
    if (gone.count(g.id(root))) continue;
    auto m = match_layer_norm(g, root);
    if (!m && g.kind(root) == "aten::mul") m = match_rms_norm(g, root);
    if (!m) continue;
    if (m->rewrite()) {
      const ViewGate gate(g);
      std::optional<Refusal> why = gate.refusal_between(m->covers);
      std::vector<ValueRef> guarded{m->x, g.output(root, 0)};
      for (ValueRef p : {m->weight, m->bias})
        if (p) guarded.push_back(p);
      if (!why) why = gate.refusal(root, guarded);
      if (!refused(m->decision, why)) {
        std::vector<size_t> inputs{
            g.id(m->x), add_constant(g, c10::IValue(std::vector<int64_t>{m->dim}), "shape")};
        if (m->op == "aten::layer_norm") {
          for (ValueRef p : {m->weight, m->bias})
            inputs.push_back(p ? g.id(p) : add_constant(g, c10::IValue(), "None"));
        } else {
          inputs.push_back(g.id(m->weight));
        }
        inputs.push_back(m->eps_value ? g.id(m->eps_value)
                                      : add_constant(g, c10::IValue(m->eps), "eps"));
        for (size_t n : replace_formula(g, root, m->op, inputs, m->covers, out).erased)
          gone.insert(n);
      }
    }
    out.decisions.push_back(std::move(m->decision));
  }
}

// A swap pass of the core's table (core/pass_table.h, SwapRule): the node
// becomes the decision's op where the view gate lets it (the TorchScript
// front end's run_swap_pass, with the view gate): output-saving-activations,
// output-saving-norms, max-pool-positions.
void run_swap_pass(const SwapRule& rule, FxGraphView& g, const CostPolicy& policy, FxResult& out) {
  const ViewGate gate(g);
  for_each_site(
      g, rule.is_site, [&](const GraphView&, NodeRef n) { return rule.decide(g, n, policy); },
      alive(g),
      [&](NodeRef n, SwapDecision& d) {
        apply_or_keep(g, n, d.decision, d.kind, gate.refusal(n, d.guarded), out);
        return false;
      },
      record(out));
}

// A formula pass of the core's table (FormulaRule): the site becomes the
// decision's op with its arguments where the view gate lets it; the covered
// nodes nobody reads any more go (the TorchScript front end's
// run_formula_pass, with the view gate).
void run_formula_pass(const FormulaRule& rule, FxGraphView& g, const CostPolicy& policy,
                      FxResult& out) {
  for_each_site(
      g, rule.is_site, [&](const GraphView&, NodeRef n) { return rule.decide(g, n, policy); },
      alive(g),
      [&](NodeRef n, FormulaDecision& d) {
        const ViewGate gate(g);
        std::optional<Refusal> why = gate.refusal_between(d.covers);
        if (!why) why = gate.refusal(n, d.guarded);
        if (refused(d.decision, why)) return false;
        std::vector<size_t> inputs;
        for (const FormulaArg& a : d.args)
          inputs.push_back(a.constant ? add_constant(g, *a.constant, a.name) : g.id(a.value));
        replace_formula(g, n, d.op, inputs, d.covers, out);
        for (const FormulaSwap& s : d.swaps) { // covered nodes that stay as another op
          std::vector<size_t> same;
          for (size_t i = 0; i < g.num_inputs(s.node); ++i)
            same.push_back(g.id(g.input(s.node, i)));
          g.rewrite_node(g.id(s.node), s.kind, "", same);
          out.rewrites.push_back({g.id(s.node), s.kind, "", std::nullopt, {}, std::nullopt});
        }
        return false;
      },
      record(out));
}

// fuse-activation-consumer: each consumer of the activation becomes
// memslim::act_<consumer>(h, <its other arguments>, act, params); the
// activation goes with the last.
void fuse_act_consumer(FxGraphView& g, const CostPolicy& policy, FxResult& out) {
  auto rewrite = [&](NodeRef a, ActConsumerDecision& d) {
    {
      const ViewGate gate(g); // the node order as the earlier rewrites left it
      std::vector<NodeRef> covers{a};
      covers.insert(covers.end(), d.passed.begin(), d.passed.end());
      covers.insert(covers.end(), d.consumers.begin(), d.consumers.end());
      std::optional<Refusal> why = gate.refusal_between(covers);
      if (!why) why = gate.refusal(a, d.guarded);
      if (!refused(d.decision, why)) {
        const size_t act = add_constant(g, c10::IValue(d.spec.act), "'" + d.spec.act + "'");
        const size_t params = add_constant(g, c10::IValue(d.spec.params), "params");
        for (size_t i = 0; i < d.consumers.size(); ++i) {
          const NodeRef c = d.consumers[i];
          std::vector<size_t> inputs{g.id(d.h)};
          for (size_t k = 1; k < g.num_inputs(c); ++k) inputs.push_back(g.id(g.input(c, k)));
          inputs.push_back(act);
          inputs.push_back(params);
          std::vector<NodeRef> goes{a};
          goes.insert(goes.end(), d.passed.begin(), d.passed.end());
          goes.push_back(c);
          replace_formula(g, c, d.fused_kind[i], inputs, goes, out);
        }
      }
    }
    return false;
  };
  for_each_site(
      g, is_act_consumer_site,
      [&](const GraphView&, NodeRef n) { return decide_act_consumer(g, n, policy); }, alive(g),
      rewrite, record(out));
}

// fuse-residual-join: the add becomes memslim::<norm>_add(residual, act,
// params, <the norm's arguments>); the norm and a folded activation go.
void fuse_residual_join(FxGraphView& g, const CostPolicy& policy, FxResult& out) {
  auto rewrite = [&](NodeRef add, JoinDecision& d) {
    {
      const ViewGate gate(g);
      std::vector<NodeRef> covers{d.norm};
      if (d.act) covers.push_back(d.act);
      covers.push_back(add);
      std::optional<Refusal> why = gate.refusal_between(covers);
      if (!why && d.inplace) why = gate.refusal_removed_write(add, g.input(add, 0));
      if (!why) why = gate.refusal(add, d.guarded);
      if (!refused(d.decision, why)) {
        std::vector<size_t> inputs{g.id(d.residual),
                                   add_constant(g, c10::IValue(d.spec.act), "'" + d.spec.act + "'"),
                                   add_constant(g, c10::IValue(d.spec.params), "params")};
        for (size_t i = 0; i < g.num_inputs(d.norm); ++i)
          inputs.push_back(g.id(g.input(d.norm, i)));
        replace_formula(g, add, d.join_kind, inputs, covers, out);
      }
    }
    return false;
  };
  for_each_site(
      g, is_residual_join_site,
      [&](const GraphView&, NodeRef n) { return decide_residual_join(g, n, policy); }, alive(g),
      rewrite, record(out), /*skip_notes=*/true); // a Note: not a join
}

// functionalize-inplace-activations: act_(x) -> act(x) where the gate proves
// nobody observes the write.
void functionalize(FxGraphView& g, FxResult& out) {
  const ViewGate gate(g);
  for_each_site(
      g, [](const GraphView&, NodeRef) { return true; }, // decide_functionalize picks
      [&](const GraphView&, NodeRef n) { return decide_functionalize(g, n); }, alive(g),
      [&](NodeRef n, FunctionalizeDecision& d) {
        std::optional<Refusal> why = gate.refusal_removed_write(n, d.written);
        if (!why) why = gate.refusal(n, {d.guarded});
        apply_or_keep(g, n, d.decision, d.functional, why, out);
        return false;
      },
      record(out));
}

// fuse-activation-dropout: dropout(act(x)) -> memslim::activation_dropout(x, act,
// params, p, train, instance); the activation goes. Dropout is priced as eager
// autograd keeps it (the policy's mask bytes left unresolved: by device).
void fuse_dropout(FxGraphView& g, const CostPolicy& policy, FxResult& out) {
  const ViewGate gate(g);
  std::optional<int64_t> instance; // one scan, before the first fusion; each takes the next
  auto rewrite = [&](NodeRef d, FuseDropoutDecision& dec) {
    if (!instance) instance = next_dropout_instance(g);
    {
      std::optional<Refusal> why = gate.refusal_between({dec.act, d});
      if (!why) why = gate.refusal(d, {dec.guarded[0], dec.guarded[1], dec.guarded[2]});
      if (!refused(dec.decision, why)) {
        const std::vector<size_t> inputs{
            g.id(dec.x),
            add_constant(g, c10::IValue(dec.spec.act), "'" + dec.spec.act + "'"),
            add_constant(g, c10::IValue(dec.spec.params), "params"),
            g.id(g.input(d, 1)),
            g.id(g.input(d, 2)),
            add_constant(g, c10::IValue((*instance)++), "instance")};
        replace_formula(g, d, kActivationDropout, inputs, {dec.act, d}, out);
      }
    }
    return false;
  };
  for_each_site(
      g, is_fuse_dropout_site,
      [&](const GraphView&, NodeRef n) { return decide_fuse_dropout(g, n, policy); }, alive(g),
      rewrite, record(out));
}

// The view's side of a region rewrite: ListConstruct(inputs) and the op go
// just before the decision's point (a list the point builds: before its
// consumer), outside readers move to the op's outputs, the region's nodes go.
void apply_region(FxGraphView& g, const RegionDecision& d, const std::string& ir, FxResult& out) {
  NodeRef point = d.point;
  while (g.kind(point) == "prim::ListConstruct" && g.num_outputs(point) == 1 &&
         !g.uses(g.output(point, 0)).empty())
    point = g.uses(g.output(point, 0)).front().user;
  FxRegion reg;
  reg.before = g.id(point);
  reg.ir = ir;
  for (NodeRef n : d.region.nodes) reg.nodes.push_back(g.id(n));
  for (ValueRef v : d.region.inputs) reg.inputs.push_back(g.id(v));
  FxGraphView::Value list;
  list.name = "region_inputs";
  const size_t list_id = g.add_value(std::move(list));
  g.insert_node_before(reg.before, "prim::ListConstruct", std::nullopt, reg.inputs, {list_id});
  const size_t text = add_constant(g, c10::IValue(ir), "region");
  for (ValueRef o : d.region.outputs) {
    FxGraphView::Value v;
    v.tensor = true;
    v.numel = g.numel(o);
    v.dtype = g.dtype(o);
    v.device = g.device(o);
    v.name = g.name(o).substr(1); // the same name in remarks ("%" dropped)
    reg.outputs.push_back(g.id(o));
    reg.new_outputs.push_back(g.add_value(std::move(v)));
  }
  const size_t op = g.insert_node_before(reg.before, kRecomputeRegionOp, std::string(),
                                         {list_id, text}, reg.new_outputs);
  for (size_t i = 0; i < reg.outputs.size(); ++i)
    g.move_uses(reg.outputs[i], reg.new_outputs[i], reg.nodes);
  FxRewrite rw{op, kRecomputeRegionOp, "", std::nullopt, {}, std::nullopt};
  for (auto it = reg.nodes.rbegin(); it != reg.nodes.rend(); ++it) {
    g.erase_node(*it);
    rw.erased.push_back(*it);
  }
  rw.region = std::move(reg);
  out.rewrites.push_back(std::move(rw));
}

// recompute-pointwise-regions: each region decided on the graph as the earlier
// ones left it, behind the view gate (nothing written between its nodes, none
// of its inputs or values written after it starts).
void recompute_regions(FxGraphView& g, const CostPolicy& policy, FxResult& out) {
  std::unique_ptr<MayRequireGrad> grad;
  for (std::vector<NodeRef>& nodes : form_regions(g)) {
    if (!grad) grad = std::make_unique<MayRequireGrad>(g);
    const ViewGate gate(g); // the node order as the earlier rewrites left it
    const StorageFacts storage{[&](ValueRef v) { return gate.storage_root(v); },
                               [&](NodeRef n) { return gate.may_write(n); }};
    RegionDecision d = decide_region(g, std::move(nodes), policy, *grad, storage);
    if (d.decision.verdict == Decision::Verdict::Note) continue; // keeps nothing today
    if (d.rewrite()) {
      std::optional<Refusal> why = gate.refusal_between(d.region.nodes);
      if (!why) why = gate.refusal(d.region.nodes.front(), d.guarded);
      std::optional<std::string> ir;
      if (!why) {
        std::string ir_why; // not a gate rule: the text does not parse back
        ir = region_ir(g, d.region, &ir_why);
        if (!ir) why = Refusal{"", ir_why};
      }
      if (!refused(d.decision, why)) {
        apply_region(g, d, *ir, out);
        grad.reset(); // its facts are keyed by values the rewrite replaced
      }
    }
    out.decisions.push_back(std::move(d.decision));
  }
}

// invertible-couplings: each chain decided by the core, behind the view gate
// (nothing written between its nodes: the backend moves the nodes between
// them that do not read the chain before it; its inputs, outputs and what its
// functions read not written after it starts). Nothing is rewritten here.
void invertible_couplings(FxGraphView& g, const CostPolicy& policy, FxResult& out) {
  for (CouplingChain& c : find_coupling_chains(g, policy)) {
    if (c.rewrite()) {
      const ViewGate gate(g);
      std::optional<Refusal> why = gate.refusal_between(c.covers);
      if (!why) why = gate.refusal(c.covers.front(), c.guarded);
      if (!refused(c.decision, why)) {
        FxChain ch{{}, c.kept_before, c.kept_after};
        for (NodeRef n : c.covers) ch.covers.push_back(g.id(n));
        out.chains.push_back(std::move(ch));
      }
    }
    out.decisions.push_back(std::move(c.decision));
  }
}

// The memory budget's block ladder over the graph as the passes left it.
// Safety: the front end applies a step as recompute tags, which Inductor's
// partitioner honours on the functionalized joint graph (AOTAutograd turns
// every in-place write, BatchNorm's running stats included, into a new value,
// and a re-run recomputes only what backward reads), so in-place writes after
// or inside a block change nothing there. What the tags cannot carry is a
// grad-mode switch (no_grad, autocast) inside a block: the view gate refuses
// those blocks (check_between without writes), and they stay out of the
// ladder, so that the steps planned are the steps applied.
// `as`: ApplyAs::Op prices whole blocks as the op would keep them (the
// ladder of 2026-11-25 (8beef7f): it reaches furthest, as each block's re-run replays
// one block); ApplyAs::Tags splits them into pieces priced as Inductor keeps
// tagged values (finer and cheaper, but its greedy stops earlier: once kept
// bytes are the whole predicted peak, no re-run fits under it).
FxLadder budget_ladder(const FxGraphView& g, const CostPolicy& policy, ApplyAs as) {
  FxLadder out;
  std::vector<Segment> segments = find_segments(g);
  const ViewGate gate(g);
  for (Segment& seg : segments) {
    if (!seg.why.empty() || seg.fn.nodes.empty()) continue;
    const std::string why = gate.check_between(seg.fn.nodes, /*writes=*/false);
    if (!why.empty()) {
      seg.why = why;
      out.refused.push_back("block at " + g.name(seg.fn.output) + ": " + why);
    }
  }
  out.segments = segments.size();
  const BlockLadder ladder = block_ladder(g, std::move(segments), -1, policy, as);
  out.why = ladder.why;
  for (size_t k = 0; k < ladder.steps.size(); ++k) {
    const LadderStep& s = ladder.steps[k];
    FxLadderStep step{s.kept, s.peak, s.flops, s.move, {}, s.light};
    for (const RecomputeBlock& b : ladder_blocks(g, ladder, k)) {
      std::vector<size_t> ids;
      for (NodeRef n : b.covers) ids.push_back(g.id(n));
      step.runs.push_back(std::move(ids));
    }
    out.steps.push_back(std::move(step));
  }
  return out;
}

// The FX implementation of each row of the core's pass table the FX front end
// has (the others carry their reason in the table: PassSpec::fx_absent).
using FxPassFn = void (*)(FxGraphView&, const CostPolicy&, FxResult&);
struct FxPass {
  const char* flag;
  FxPassFn run;
};
const FxPass kFxPasses[] = {
    {kFunctionalizePass,
     [](FxGraphView& g, const CostPolicy&, FxResult& o) { functionalize(g, o); }},
    {kCanonicalizePass, [](FxGraphView& g, const CostPolicy&, FxResult& o) { canonicalize(g, o); }},
    {kCanonicalizeNormsPass,
     [](FxGraphView& g, const CostPolicy&, FxResult& o) { canonicalize_norms(g, o); }},
    {kInvertibleCouplingsPass, invertible_couplings},
    {kFuseDropoutPass, fuse_dropout},
    {kRecomputeRegionsPass, recompute_regions},
    {kFuseActConsumerPass, fuse_act_consumer},
    {kFuseResidualJoinPass, fuse_residual_join},
};

} // namespace

const std::vector<std::string>& fx_default_passes() {
  static const std::vector<std::string> passes =
      find_pipeline_spec("memslim-default")->passes(FrontEnd::Fx);
  return passes;
}

FxResult run_fx(FxGraphView& g, const std::vector<std::string>& passes, const CostPolicy& policy,
                FxLadders ladders) {
  FxResult out;
  for (const std::string& p : passes) {
    const PassSpec* spec = find_pass_spec(p);
    if (!spec) throw std::invalid_argument("unknown pass '" + p + "'");
    FxPassFn run = nullptr;
    for (const FxPass& f : kFxPasses)
      if (p == f.flag) run = f.run;
    if (spec->swap.decide)
      run_swap_pass(spec->swap, g, policy, out);
    else if (spec->formula.decide)
      run_formula_pass(spec->formula, g, policy, out);
    else if (run)
      run(g, policy, out);
    else
      out.decisions.push_back({p, Decision::Verdict::Note, "", spec->fx_absent, {}});
  }
  if (policy.memory_budget > 0) {
    if (ladders == FxLadders::Both || ladders == FxLadders::Op)
      out.ladder = budget_ladder(g, policy, ApplyAs::Op);
    if (ladders == FxLadders::Both || ladders == FxLadders::Tags)
      out.pieces = budget_ladder(g, policy, ApplyAs::Tags);
  }
  return out;
}

} // namespace memslim
