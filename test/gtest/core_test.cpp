//===- core_test.cpp - unit tests of the front-end-neutral decision core ---===//
//
// What: the saved-tensor rules, the output-saving and functionalize decisions,
// the view gate and run_fx over hand-built FxGraphViews (no Python, no FX), and
// the same decision over a JitGraphView of the equivalent TorchScript graph:
// both views give the same record; recompute regions (formation, price with
// who requires grad, placement, the op's text) over an FxGraphView.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/script.h>

#include "memslim/core/couplings.h"
#include "memslim/core/functionalize.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/recompute_blocks.h"
#include "memslim/core/recompute_regions.h"
#include "memslim/core/saved_tensors.h"
#include "memslim/fx/fx_front_end.h"
#include "memslim/fx/fx_graph_view.h"
#include "memslim/fx/region_ir.h"
#include "memslim/fx/view_gate.h"
#include "memslim/jit/jit_graph_view.h"

namespace {

using memslim::Decision;
using memslim::FxGraphView;

// A small FX-like graph builder: tensors of n fp32 elements, constants.
struct Builder {
  FxGraphView g;
  std::vector<size_t> params;
  std::optional<c10::DeviceType> device; // of every tensor it makes
  size_t tensor(const std::string& name, int64_t n = 64) {
    FxGraphView::Value v;
    v.name = name;
    v.tensor = true;
    v.numel = n;
    v.dtype = at::kFloat;
    v.device = device;
    return g.add_value(v);
  }
  size_t constant(c10::IValue c) {
    FxGraphView::Value v;
    v.name = "c";
    v.constant = std::move(c);
    return g.add_value(v);
  }
  size_t none() { return constant(c10::IValue()); }
  size_t op(const std::string& kind, const std::string& overload, std::vector<size_t> in,
            const std::string& out, int64_t n = 64) {
    const size_t o = tensor(out, n);
    g.add_node(kind, overload, in, {o});
    return o;
  }
  void inputs(std::vector<size_t> vs) { g.add_node("prim::Param", std::nullopt, {}, vs); }
  void ret(std::vector<size_t> vs) { g.add_node("prim::Return", std::nullopt, vs, {}); }
};

// linear -> gelu -> linear: x is kept by nobody else, y by the second linear.
struct Mlp : Builder {
  size_t x, w1, w2, h, y, out;
  Mlp() {
    x = tensor("x");
    w1 = tensor("w1");
    w2 = tensor("w2");
    inputs({x, w1, w2});
    h = op("aten::linear", "", {x, w1, none()}, "h");
    y = op("aten::gelu", "", {h, constant(std::string("none"))}, "gelu");
    out = op("aten::linear", "", {y, w2, none()}, "out");
  }
};

// linear -> gelu(approximate) -> dropout(0.1, train) -> linear, tensors on `device`.
struct GeluDropout : Builder {
  size_t x0, w, h, a, d, out;
  explicit GeluDropout(const std::string& approximate,
                       std::optional<c10::DeviceType> on = std::nullopt) {
    device = on;
    x0 = tensor("x0");
    w = tensor("w");
    inputs({x0, w});
    h = op("aten::linear", "", {x0, w, none()}, "h");
    a = op("aten::gelu", "", {h, constant(approximate)}, "a");
    d = op("aten::dropout", "", {a, constant(0.1), constant(true)}, "d");
    out = op("aten::linear", "", {d, w, none()}, "out");
    ret({out});
  }
};

memslim::NodeRef node_named(const FxGraphView& g, const std::string& kind) {
  for (auto n : g.nodes())
    if (g.kind(n) == kind) return n;
  return {};
}

TEST(Core, SavedTensorRulesOverAnFxView) {
  Mlp m;
  m.ret({m.out});
  const auto gelu = node_named(m.g, "aten::gelu");
  EXPECT_TRUE(memslim::saved::keeps_input(m.g, gelu, 0));
  std::string who;
  EXPECT_TRUE(memslim::saved::kept_by_other(m.g, m.g.value_ref(m.y), {gelu}, &who));
  EXPECT_EQ(who, "aten::linear");
  EXPECT_FALSE(memslim::saved::kept_by_other(m.g, m.g.value_ref(m.h), {gelu}));
}

TEST(Core, ModuleStateIsKeptByTheModule) {
  // timm's StdConv2d: batch_norm(weight.reshape(...)) -> conv. The norm's input
  // is a view of a parameter: the module keeps it, whoever reads it; a user
  // input of the same shape is kept by nobody.
  Builder b;
  const size_t x = b.tensor("x");
  FxGraphView::Value param;
  param.name = "w";
  param.tensor = true;
  param.numel = 64;
  param.dtype = at::kFloat;
  param.module_state = true;
  const size_t w = b.g.add_value(param), u = b.tensor("u");
  b.inputs({x, w, u});
  const size_t shape = b.constant(c10::IValue(std::vector<int64_t>{1, 4, 16}));
  const size_t wv = b.op("aten::reshape", "", {w, shape}, "wv");
  const size_t uv = b.op("aten::reshape", "", {u, shape}, "uv");
  const auto view = node_named(b.g, "aten::reshape");
  std::string who;
  EXPECT_TRUE(memslim::saved::kept_by_other(b.g, b.g.value_ref(wv), {view}, &who));
  EXPECT_EQ(who, "the module (a parameter or buffer)");
  EXPECT_FALSE(memslim::saved::kept_by_other(b.g, b.g.value_ref(uv), {}));
  EXPECT_FALSE(memslim::saved::kept_by_other(b.g, b.g.value_ref(x), {}));
}

TEST(Core, OutputSavingDecisionAndPrice) {
  Mlp m;
  m.ret({m.out});
  const auto d = memslim::decide_output_saving(m.g, node_named(m.g, "aten::gelu"), {});
  ASSERT_TRUE(d.rewrite());
  EXPECT_EQ(d.memslim_kind, "memslim::gelu");
  EXPECT_EQ(*d.decision.price.before, 256); // x: 64 fp32
  EXPECT_EQ(*d.decision.price.after, 8);    // 64 bits
  EXPECT_EQ(d.decision.render(),
            "remark: output-saving-activations: rewrote aten::gelu at %gelu: keeps output + bits "
            "instead of input, frees 248 B (256 -> 8)");
  memslim::CostPolicy p;
  p.max_added_work = 1;
  const auto kept = memslim::decide_output_saving(m.g, node_named(m.g, "aten::gelu"), p);
  EXPECT_EQ(kept.decision.verdict, Decision::Verdict::Kept);
  EXPECT_NE(kept.decision.text.find("above the maximum"), std::string::npos);
}

TEST(Core, ZeroDropoutPassesItsKeeperBack) {
  // gelu -> dropout(p=0, train) -> linear: eager's dropout returns its input, so
  // the linear keeps the gelu's output.
  Builder b;
  const size_t x = b.tensor("x"), w = b.tensor("w");
  b.inputs({x, w});
  const size_t y = b.op("aten::gelu", "", {x, b.constant(std::string("none"))}, "gelu");
  const size_t d = b.op("aten::dropout", "", {y, b.constant(0.0), b.constant(true)}, "drop");
  b.ret({b.op("aten::linear", "", {d, w, b.none()}, "out")});
  const auto gelu = node_named(b.g, "aten::gelu");
  EXPECT_TRUE(memslim::saved::kept_by_other(b.g, b.g.value_ref(y), {gelu}));
}

TEST(Core, ViewGateRefusesALaterWriteThroughAView) {
  Mlp m;
  const size_t view = m.op("aten::view", "", {m.y, m.constant(std::vector<int64_t>{-1})}, "v");
  m.op("aten::add_", "Tensor", {view, m.constant(1.0), m.constant(int64_t(1))}, "add_");
  m.ret({m.out});
  memslim::FxResult r = memslim::run_fx(m.g, {"output-saving-activations"}, {});
  ASSERT_EQ(r.decisions.size(), 1u);
  EXPECT_EQ(r.decisions[0].verdict, Decision::Verdict::Kept);
  EXPECT_NE(r.decisions[0].text.find("written in place afterwards by aten::add_"),
            std::string::npos);
  EXPECT_TRUE(r.rewrites.empty());
}

TEST(Core, FunctionalizeNeedsAFreshUnsharedInput) {
  Builder b;
  const size_t x = b.tensor("x"), w = b.tensor("w"), z = b.tensor("z");
  b.inputs({x, w, z});
  const size_t h = b.op("aten::linear", "", {x, w, b.none()}, "h");
  const size_t s = b.op("aten::silu_", "", {h}, "silu_");
  const size_t gx = b.op("aten::silu_", "", {z}, "silu_z"); // a graph input: the caller sees it
  b.ret({b.op("aten::linear", "", {s, w, b.none()}, "out"), gx});
  memslim::FxResult r = memslim::run_fx(b.g, {memslim::kFunctionalizePass}, {});
  ASSERT_EQ(r.decisions.size(), 2u);
  EXPECT_EQ(r.decisions[0].verdict, Decision::Verdict::Rewrote);
  EXPECT_EQ(r.decisions[1].verdict, Decision::Verdict::Kept);
  EXPECT_EQ(r.decisions[1].text, "its input is a graph input");
  ASSERT_EQ(r.rewrites.size(), 1u);
  EXPECT_EQ(r.rewrites[0].kind, "aten::silu");
}

TEST(Core, DropoutKindsAreOneTable) {
  EXPECT_TRUE(memslim::saved::is_dropout_kind("aten::dropout", false));
  EXPECT_TRUE(memslim::saved::is_dropout_kind("aten::feature_alpha_dropout_", true));
  EXPECT_FALSE(memslim::saved::is_dropout_kind("aten::dropout_", false));
  EXPECT_FALSE(memslim::saved::is_dropout_kind("aten::dropout", true));
  EXPECT_FALSE(memslim::saved::is_dropout_kind("aten::dropou", false));
  EXPECT_FALSE(memslim::saved::is_dropout_kind("", true));
}

TEST(Core, BadFxRecordsAreErrors) {
  FxGraphView g;
  EXPECT_THROW(g.add_node("aten::no_such_op", "", {}, {}), std::invalid_argument);
  EXPECT_THROW(g.add_node("prim::Return", std::nullopt, {7}, {}), std::invalid_argument);
}

TEST(Core, BothViewsDecideAlike) {
  // The Mlp above as TorchScript IR: the JitGraphView gives the same record.
  auto graph = std::make_shared<torch::jit::Graph>();
  torch::jit::parseIR(R"IR(
graph(%x : Float(8, 8, strides=[8, 1], device=cpu),
      %w1 : Float(8, 8, strides=[8, 1], device=cpu),
      %w2 : Float(8, 8, strides=[8, 1], device=cpu)):
  %none : NoneType = prim::Constant()
  %approx : str = prim::Constant[value="none"]()
  %h : Float(8, 8, strides=[8, 1], device=cpu) = aten::linear(%x, %w1, %none)
  %gelu : Float(8, 8, strides=[8, 1], device=cpu) = aten::gelu(%h, %approx)
  %out : Float(8, 8, strides=[8, 1], device=cpu) = aten::linear(%gelu, %w2, %none)
  return (%out))IR",
                      graph.get());
  const memslim::JitGraphView jv(graph);
  memslim::NodeRef site;
  for (auto n : jv.nodes())
    if (jv.kind(n) == "aten::gelu") site = n;
  Mlp m;
  m.ret({m.out});
  const auto a = memslim::decide_output_saving(jv, site, {});
  const auto b = memslim::decide_output_saving(m.g, node_named(m.g, "aten::gelu"), {});
  // Value names are each front end's (parseIR numbers them); the rest is one record.
  EXPECT_EQ(a.decision.verdict, b.decision.verdict);
  EXPECT_EQ(a.decision.price.before, b.decision.price.before);
  EXPECT_EQ(a.decision.price.after, b.decision.price.after);
  EXPECT_EQ(a.decision.price.added_work, b.decision.price.added_work);
  const auto tail = [](const std::string& t) { return t.substr(t.find(": ")); };
  EXPECT_EQ(tail(a.decision.text), tail(b.decision.text));
}

TEST(Core, CanonicalizeRewritesTheFormulaAndDropsItsNodes) {
  // linear -> x * sigmoid(x) -> linear: the root becomes aten::silu(x), the
  // sigmoid goes (from nodes() and from x's uses), and output-saving, run
  // after it, sees the silu with one use of x.
  Builder b;
  const size_t x0 = b.tensor("x0"), w = b.tensor("w");
  b.inputs({x0, w});
  const size_t h = b.op("aten::linear", "", {x0, w, b.none()}, "h");
  const size_t s = b.op("aten::sigmoid", "", {h}, "s");
  const size_t r = b.op("aten::mul", "Tensor", {h, s}, "r");
  const size_t out = b.op("aten::linear", "", {r, w, b.none()}, "out");
  b.ret({out});
  const auto res = memslim::run_fx(b.g, {"canonicalize-activations", "output-saving-activations"},
                                   memslim::CostPolicy{});
  ASSERT_EQ(res.decisions.size(), 2u);
  EXPECT_EQ(res.decisions[0].verdict, Decision::Verdict::Rewrote);
  EXPECT_EQ(res.decisions[0].site, "x * sigmoid(x) at %r");
  EXPECT_EQ(res.decisions[1].verdict, Decision::Verdict::Rewrote) << res.decisions[1].text;
  ASSERT_EQ(res.rewrites.size(), 2u);
  const auto& canon = res.rewrites[0];
  EXPECT_EQ(canon.kind, "aten::silu");
  ASSERT_TRUE(canon.args.has_value());
  ASSERT_EQ(canon.args->size(), 1u);
  EXPECT_EQ(*(*canon.args)[0].value, h);
  ASSERT_EQ(canon.erased.size(), 1u);
  EXPECT_EQ(b.g.kind(b.g.producer(b.g.value_ref(s))), "aten::sigmoid");
  EXPECT_FALSE(node_named(b.g, "aten::sigmoid"));
  EXPECT_EQ(b.g.uses(b.g.value_ref(h)).size(), 1u);
  EXPECT_EQ(res.rewrites[1].kind, "memslim::silu");
  EXPECT_EQ(b.g.kind(b.g.producer(b.g.value_ref(r))), "memslim::silu");
}

TEST(Core, FuseDropoutPricesNoiseAndHandsBackConstantArguments) {
  // linear -> gelu -> dropout(0.1, train) -> linear: aten keeps the linear's
  // output (gelu's input) and dropout's float noise; the fused op keeps its
  // output (the next linear keeps it anyway) + 2 bits. The rewrite's arguments:
  // x as a value, the kernel name, params, p, train and the instance as constants.
  GeluDropout b("tanh");
  const size_t h = b.h, a = b.a;
  const auto res = memslim::run_fx(b.g, {"fuse-activation-dropout"}, memslim::CostPolicy{});
  ASSERT_EQ(res.decisions.size(), 1u);
  const Decision& dec = res.decisions[0];
  EXPECT_EQ(dec.verdict, Decision::Verdict::Rewrote) << dec.text;
  EXPECT_EQ(*dec.price.before, 64 * 4 + 64 * 4); // x + float noise
  EXPECT_EQ(*dec.price.after, 2 * 8);            // 2 bits per element
  ASSERT_EQ(res.rewrites.size(), 1u);
  const auto& rw = res.rewrites[0];
  EXPECT_EQ(rw.kind, "memslim::activation_dropout");
  ASSERT_TRUE(rw.args.has_value());
  ASSERT_EQ(rw.args->size(), 6u);
  EXPECT_EQ(*(*rw.args)[0].value, h);
  EXPECT_EQ((*rw.args)[1].constant.toStringRef(), "gelu_tanh");
  EXPECT_DOUBLE_EQ((*rw.args)[3].constant.toDouble(), 0.1);
  EXPECT_TRUE((*rw.args)[4].constant.toBool());
  EXPECT_EQ((*rw.args)[5].constant.toInt(), 1);
  EXPECT_EQ(rw.erased, std::vector<size_t>{b.g.id(b.g.producer(b.g.value_ref(a)))});
  EXPECT_FALSE(node_named(b.g, "aten::gelu"));
}

TEST(Core, FuseDropoutPricesEagerCudaDropoutAsABoolMask) {
  // On CUDA aten::dropout runs native_dropout, which keeps a bool mask (1 byte per
  // element), not float noise; an explicit dropout_mask_bytes still wins.
  for (int explicit_bytes : {-1, 0}) {
    GeluDropout b("none", c10::DeviceType::CUDA);
    memslim::CostPolicy policy;
    policy.dropout_mask_bytes = explicit_bytes;
    const auto res = memslim::run_fx(b.g, {"fuse-activation-dropout"}, policy);
    ASSERT_EQ(res.decisions.size(), 1u);
    const Decision& dec = res.decisions[0];
    EXPECT_EQ(*dec.price.before, 64 * 4 + (explicit_bytes < 0 ? 64 : 64 * 4)) << dec.text;
    EXPECT_NE(dec.text.find(explicit_bytes < 0 ? "dropout mask" : "dropout noise"),
              std::string::npos)
        << dec.text;
  }
}

TEST(Core, ViewGateSeesWrittenListsAndNodesWithoutSchema) {
  // linear -> gelu -> linear, then the gelu's output is (a) an element of a list
  // _foreach_add_ writes, (b) handed to a node without a schema (a higher-order
  // op memslim cannot see into), (c) read by a plain op: (a) and (b) keep the
  // output-saving site, (c) does not.
  for (int variant = 0; variant < 3; ++variant) {
    Mlp m;
    if (variant == 0) {
      const size_t list = m.tensor("list");
      m.g.add_node("prim::ListConstruct", std::nullopt, {m.y, m.x}, {list});
      m.g.add_node("aten::_foreach_add_", "Scalar", {list, m.constant(1.0)}, {});
    } else if (variant == 1) {
      m.g.add_node("python::wrap_with_set_grad_enabled", std::nullopt, {m.y}, {m.tensor("hop")});
    } else {
      m.op("aten::sum", "", {m.y, m.none()}, "s");
    }
    m.ret({m.out});
    const auto res = memslim::run_fx(m.g, {"output-saving-activations"}, memslim::CostPolicy{});
    ASSERT_EQ(res.decisions.size(), 1u);
    const Decision& d = res.decisions[0];
    if (variant == 2) {
      EXPECT_EQ(d.verdict, Decision::Verdict::Rewrote) << d.text;
      continue;
    }
    EXPECT_EQ(d.verdict, Decision::Verdict::Kept) << variant;
    EXPECT_NE(d.text.find(variant == 0 ? "written in place afterwards by aten::_foreach_add_"
                                       : "no schema: memslim cannot see"),
              std::string::npos)
        << d.text;
  }
}

// linear -> [sigmoid(order) -> mul -> mul(., buf) -> exp] -> linear: one region
// of four ops whose inputs are h, the 0-dim order and the 0-dim buffer.
struct Formula : Builder {
  size_t x, w, order, buf, h, a, m, e, s, out;
  Formula() {
    x = tensor("x");
    w = tensor("w");
    order = tensor("order", 1);
    buf = tensor("buf", 1);
    inputs({x, w, order, buf});
    h = op("aten::linear", "", {x, w, none()}, "h");
    a = op("aten::sigmoid", "", {order}, "a", 1);
    m = op("aten::mul", "Tensor", {h, a}, "m");
    s = op("aten::mul", "Tensor", {m, buf}, "s");
    e = op("aten::exp", "", {s}, "e");
    out = op("aten::linear", "", {e, w, none()}, "out");
    ret({out});
  }
  memslim::StorageFacts storage(const memslim::ViewGate& gate) const {
    return {[&gate](memslim::ValueRef v) { return gate.storage_root(v); },
            [&gate](memslim::NodeRef n) { return gate.may_write(n); }};
  }
};

TEST(Core, RegionPricedByWhoRequiresGrad) {
  for (bool buffer_known : {true, false}) {
    Formula f;
    // The view knows the buffer does not require grad (an ExportedProgram's
    // buffer); unknown, a floating input may.
    if (buffer_known) {
      FxGraphView::Value* v = const_cast<FxGraphView::Value*>(
          static_cast<const FxGraphView::Value*>(f.g.value_ref(f.buf).p));
      v->requires_grad = false;
    }
    const auto regions = memslim::form_regions(f.g);
    ASSERT_EQ(regions.size(), 1u);
    EXPECT_EQ(regions[0].size(), 4u);
    const memslim::MayRequireGrad grad(f.g);
    EXPECT_EQ(grad(f.g.value_ref(f.buf)), !buffer_known);
    EXPECT_TRUE(grad(f.g.value_ref(f.a)));
    const memslim::ViewGate gate(f.g);
    const auto d =
        memslim::decide_region(f.g, regions[0], memslim::CostPolicy{}, grad, f.storage(gate));
    // Kept today: h and a (mul keeps each for the other's gradient), buf (for
    // m's gradient), and m only for buf's gradient (exp's output e is kept by
    // the next linear anyway). The op keeps h, order and buf: with buf known
    // not to require grad, the region frees nothing.
    EXPECT_EQ(*d.decision.price.before, 256 + 4 + 4 + (buffer_known ? 0 : 256));
    EXPECT_EQ(*d.decision.price.after, 256 + 4 + 4);
    EXPECT_EQ(*d.decision.price.added_work, 3.0); // the 0-dim sigmoid is not full size
    if (buffer_known) {
      EXPECT_EQ(d.decision.verdict, Decision::Verdict::Kept);
      EXPECT_NE(d.decision.text.find("recomputing the region would free 0 B"), std::string::npos)
          << d.decision.text;
      continue;
    }
    ASSERT_TRUE(d.rewrite()) << d.decision.text;
    ASSERT_EQ(d.region.inputs.size(), 3u);
    EXPECT_EQ(d.region.outputs.size(), 1u);
    EXPECT_EQ(f.g.id(d.region.outputs[0]), f.e);
    std::string err;
    const auto ir = memslim::region_ir(f.g, d.region, &err);
    ASSERT_TRUE(ir) << err;
    EXPECT_NE(ir->find("aten::exp"), std::string::npos) << *ir;
    auto parsed = std::make_shared<torch::jit::Graph>();
    torch::jit::parseIR(*ir, parsed.get());
    EXPECT_EQ(parsed->inputs().size(), 3u);
    EXPECT_EQ(parsed->outputs().size(), 1u);
  }
}

TEST(Core, RegionMergeRefusedWhenAnInputComesAfterAConsumer) {
  // a = exp(x) is read by o = linear(a) before y2 = linear(x) is made, and
  // c = mul(a, y2): one op for {exp, mul} would have to go before o and after
  // y2 at once, so they stay two regions.
  Builder b;
  const size_t x = b.tensor("x"), w = b.tensor("w");
  b.inputs({x, w});
  const size_t a = b.op("aten::exp", "", {x}, "a");
  const size_t o = b.op("aten::linear", "", {a, w, b.none()}, "o");
  const size_t y2 = b.op("aten::linear", "", {x, w, b.none()}, "y2");
  const size_t c = b.op("aten::mul", "Tensor", {a, y2}, "c");
  b.ret({o, c});
  EXPECT_EQ(memslim::form_regions(b.g).size(), 2u);
}

TEST(Core, RunFxReplacesARegionByOneOpBeforeItsFirstReader) {
  Formula f;
  const auto res = memslim::run_fx(f.g, {memslim::kRecomputeRegionsPass}, memslim::CostPolicy{});
  ASSERT_EQ(res.decisions.size(), 1u);
  EXPECT_EQ(res.decisions[0].verdict, Decision::Verdict::Rewrote) << res.decisions[0].text;
  ASSERT_EQ(res.rewrites.size(), 1u);
  const auto& rw = res.rewrites[0];
  ASSERT_TRUE(rw.region);
  EXPECT_EQ(rw.kind, memslim::kRecomputeRegionOp);
  EXPECT_EQ(rw.region->nodes.size(), 4u);
  EXPECT_EQ(rw.erased.size(), 4u);
  EXPECT_EQ(rw.region->outputs, std::vector<size_t>{f.e});
  // The view: the op's output feeds the last linear; the region's nodes are gone.
  const memslim::NodeRef last = f.g.producer(f.g.value_ref(f.out));
  const memslim::NodeRef op = f.g.producer(f.g.input(last, 0));
  ASSERT_TRUE(op);
  EXPECT_EQ(f.g.kind(op), memslim::kRecomputeRegionOp);
  std::vector<std::string> kinds;
  for (memslim::NodeRef n : f.g.nodes()) kinds.push_back(f.g.kind(n));
  EXPECT_EQ(kinds, (std::vector<std::string>{"prim::Param", "aten::linear", "prim::ListConstruct",
                                             memslim::kRecomputeRegionOp, "aten::linear",
                                             "prim::Return"}));
}

} // namespace

namespace {

// K additive couplings over an FX view: y1 = x1 + tanh(linear(x2, wf)), y2 =
// x2 + tanh(linear(y1, wg)), each block's outputs the next one's inputs.
// `leak`: the first F's linear output is also returned. `chunked`: blocks are
// linked as RevNet links them, chunk(cat([y1, y2], 1), 2, 1), in an FX graph's
// form: chunk's two outputs are the node's own (no ListUnpack).
struct Couplings : Builder {
  size_t y1 = 0, y2 = 0, leaked = 0;
  explicit Couplings(int blocks, bool leak = false, bool chunked = false) {
    size_t x1 = tensor("x1"), x2 = tensor("x2");
    std::vector<size_t> in{x1, x2}, w;
    for (int b = 0; b < 2 * blocks; ++b)
      in.push_back(w.emplace_back(tensor("w" + std::to_string(b))));
    inputs(in);
    const size_t one = constant(int64_t(1));
    for (int b = 0; b < blocks; ++b) {
      const std::string s = std::to_string(b);
      const size_t hf = op("aten::linear", "", {x2, w[2 * b], none()}, "hf" + s);
      if (b == 0) leaked = hf;
      const size_t f = op("aten::tanh", "", {hf}, "f" + s);
      y1 = op("aten::add", "Tensor", {x1, f, one}, "y1_" + s);
      const size_t hg = op("aten::linear", "", {y1, w[2 * b + 1], none()}, "hg" + s);
      const size_t gv = op("aten::tanh", "", {hg}, "g" + s);
      y2 = op("aten::add", "Tensor", {x2, gv, one}, "y2_" + s);
      x1 = y1;
      x2 = y2;
      if (chunked && b + 1 < blocks) {
        const size_t list = g.add_value(FxGraphView::Value{});
        g.add_node("prim::ListConstruct", std::nullopt, {y1, y2}, {list});
        const size_t cat = op("aten::cat", "", {list, one}, "cat" + s, 128);
        x1 = tensor("chunk" + s + "[0]");
        x2 = tensor("chunk" + s + "[1]");
        g.add_node("aten::chunk", "", {cat, constant(int64_t(2)), one}, {x1, x2});
      }
    }
    std::vector<size_t> outs{y1, y2};
    if (leak) outs.push_back(leaked);
    ret(outs);
  }
};

} // namespace

TEST(Core, CouplingChainOverAnFxView) {
  Couplings c(3);
  const auto chains = memslim::find_coupling_chains(c.g, {});
  ASSERT_EQ(chains.size(), 1u);
  const auto& ch = chains[0];
  EXPECT_TRUE(ch.rewrite()) << ch.decision.render();
  ASSERT_EQ(ch.blocks.size(), 3u);
  EXPECT_EQ(ch.link_kinds, (std::vector<int64_t>{0, 0}));
  // F and G: linear + tanh each; the adds and every function node covered.
  for (const auto& b : ch.blocks) {
    EXPECT_EQ(b.F.nodes.size(), 2u);
    EXPECT_EQ(b.G.nodes.size(), 2u);
    EXPECT_EQ(b.F.external.size(), 1u); // its weight (None is a constant)
  }
  EXPECT_EQ(ch.covers.size(), 18u);
  // Keeps 2 outputs of 64 floats instead of what the 12 ops keep.
  EXPECT_EQ(ch.kept_after, 2 * 64 * 4);
  EXPECT_GT(ch.kept_before, ch.kept_after);
}

TEST(Core, CouplingChainLinkedByAnFxChunk) {
  Couplings c(3, /*leak=*/false, /*chunked=*/true);
  const auto chains = memslim::find_coupling_chains(c.g, {});
  ASSERT_EQ(chains.size(), 1u);
  const auto& ch = chains[0];
  EXPECT_TRUE(ch.rewrite()) << ch.decision.render();
  ASSERT_EQ(ch.blocks.size(), 3u);
  EXPECT_EQ(ch.link_kinds, (std::vector<int64_t>{1, 1}));
  // 18 block nodes and, per link, ListConstruct, cat and chunk (no unpack).
  EXPECT_EQ(ch.covers.size(), 18u + 2 * 3);
}

namespace {

// K affine couplings over an FX view, RealNVP's half then Glow's:
//   y1 = x1 * exp(tanh(hf)) + sigmoid(hf),      hf = linear(x2, wf)
//   y2 = (x2 + tanh(hg)) * sigmoid(hg),         hg = linear(y1, wg)
struct AffineCouplings : Builder {
  explicit AffineCouplings(int blocks) {
    size_t x1 = tensor("x1"), x2 = tensor("x2");
    std::vector<size_t> in{x1, x2}, w;
    for (int b = 0; b < 2 * blocks; ++b)
      in.push_back(w.emplace_back(tensor("w" + std::to_string(b))));
    inputs(in);
    const size_t one = constant(int64_t(1));
    size_t y1 = 0, y2 = 0;
    for (int b = 0; b < blocks; ++b) {
      const std::string s = std::to_string(b);
      const size_t hf = op("aten::linear", "", {x2, w[2 * b], none()}, "hf" + s);
      const size_t m1 = op("aten::exp", "", {op("aten::tanh", "", {hf}, "sf" + s)}, "mf" + s);
      const size_t t1 = op("aten::sigmoid", "", {hf}, "tf" + s);
      const size_t p1 = op("aten::mul", "Tensor", {x1, m1}, "pf" + s);
      y1 = op("aten::add", "Tensor", {p1, t1, one}, "y1_" + s);
      const size_t hg = op("aten::linear", "", {y1, w[2 * b + 1], none()}, "hg" + s);
      const size_t t2 = op("aten::tanh", "", {hg}, "tg" + s);
      const size_t q2 = op("aten::add", "Tensor", {x2, t2, one}, "qg" + s);
      const size_t m2 = op("aten::sigmoid", "", {hg}, "mg" + s);
      y2 = op("aten::mul", "Tensor", {q2, m2}, "y2_" + s);
      x1 = y1;
      x2 = y2;
    }
    ret({y1, y2});
  }
};

} // namespace

TEST(Core, AffineCouplingChainOverAnFxView) {
  AffineCouplings c(3);
  const auto chains = memslim::find_coupling_chains(c.g, {});
  ASSERT_EQ(chains.size(), 1u);
  const auto& ch = chains[0];
  EXPECT_TRUE(ch.rewrite()) << ch.decision.render();
  EXPECT_NE(ch.decision.text.find("3 affine couplings"), std::string::npos) << ch.decision.text;
  ASSERT_EQ(ch.blocks.size(), 3u);
  for (const auto& b : ch.blocks) {
    EXPECT_EQ(b.combine1, memslim::Combine::MulAdd);
    EXPECT_EQ(b.combine2, memslim::Combine::AddMul);
    // F: linear, tanh, exp, sigmoid -> (m, t); G: linear, tanh, sigmoid -> (m, t).
    EXPECT_EQ(b.F.nodes.size(), 4u);
    EXPECT_EQ(b.G.nodes.size(), 3u);
    EXPECT_EQ(c.g.name(b.F.output).rfind("%mf", 0), 0u) << c.g.name(b.F.output);
    EXPECT_EQ(c.g.name(b.F.output2).rfind("%tf", 0), 0u) << c.g.name(b.F.output2);
    EXPECT_EQ(c.g.name(b.G.output).rfind("%mg", 0), 0u) << c.g.name(b.G.output);
    EXPECT_EQ(c.g.name(b.G.output2).rfind("%tg", 0), 0u) << c.g.name(b.G.output2);
    EXPECT_EQ(b.combine_nodes().size(), 4u);
  }
  EXPECT_EQ(ch.covers.size(), 33u); // 3 x (4 + 3 function nodes + 4 combining nodes)
  EXPECT_EQ(ch.kept_after, 2 * 64 * 4);
  EXPECT_GT(ch.kept_before, ch.kept_after);
}

TEST(Core, CouplingWhoseFunctionValueIsReadElsewhereIsKept) {
  Couplings c(1, /*leak=*/true);
  const auto chains = memslim::find_coupling_chains(c.g, {});
  ASSERT_EQ(chains.size(), 1u);
  EXPECT_FALSE(chains[0].rewrite());
  EXPECT_NE(chains[0].decision.text.find("also read outside it"), std::string::npos)
      << chains[0].decision.text;
}

namespace {

// K residual blocks x + linear(tanh(linear(x, wa) * mask), wb) over an FX view;
// `mask` (no grad, like an attention mask) is read by every block.
struct Residuals : Builder {
  size_t out = 0, mask = 0;
  // switch_at: a grad-mode switch (torch._C._set_grad_enabled) inside that block.
  explicit Residuals(int blocks, int switch_at = -1) {
    size_t x = tensor("x");
    mask = tensor("mask");
    std::vector<size_t> in{x, mask}, w;
    for (int b = 0; b < 2 * blocks; ++b)
      in.push_back(w.emplace_back(tensor("w" + std::to_string(b))));
    inputs(in);
    FxGraphView::Value* m = const_cast<FxGraphView::Value*>(
        static_cast<const FxGraphView::Value*>(g.value_ref(mask).p));
    m->requires_grad = false;
    const size_t one = constant(int64_t(1));
    for (int b = 0; b < blocks; ++b) {
      const std::string s = std::to_string(b);
      const size_t h = op("aten::linear", "", {x, w[2 * b], none()}, "h" + s);
      if (b == switch_at)
        g.add_node("python::_set_grad_enabled", std::nullopt, {constant(c10::IValue(true))}, {});
      const size_t hm = op("aten::mul", "Tensor", {h, mask}, "hm" + s);
      const size_t a = op("aten::tanh", "", {hm}, "a" + s);
      const size_t o = op("aten::linear", "", {a, w[2 * b + 1], none()}, "o" + s);
      x = op("aten::add", "Tensor", {x, o, one}, "x" + s);
    }
    out = x;
    ret({out});
  }
};

} // namespace

TEST(Core, BlockSegmentsAreTheResidualBlocks) {
  Residuals r(4);
  const auto segs = memslim::find_segments(r.g);
  ASSERT_EQ(segs.size(), 4u);
  for (size_t i = 0; i < segs.size(); ++i) {
    EXPECT_EQ(segs[i].fn.nodes.size(), 5u); // linear, mul, tanh, linear, add
    EXPECT_TRUE(segs[i].why.empty()) << segs[i].why;
    // Its weights and the mask, read from outside.
    EXPECT_EQ(segs[i].fn.external.size(), 3u);
    if (i > 0) EXPECT_EQ(segs[i].fn.input, segs[i - 1].fn.output);
    EXPECT_GT(segs[i].flops, 0);
  }
  EXPECT_EQ(r.g.id(segs.back().fn.output), r.out);
}

TEST(Core, BlockLadderIsMonotoneAndStartsFromTheWholeGraph) {
  Residuals r(6);
  const auto total = memslim::total_kept_bytes(r.g);
  ASSERT_TRUE(total);
  const auto ladder = memslim::block_ladder(r.g, memslim::find_segments(r.g), -1, {});
  ASSERT_TRUE(ladder.why.empty()) << ladder.why;
  ASSERT_GT(ladder.steps.size(), 2u);
  EXPECT_EQ(ladder.steps[0].kept, *total);
  EXPECT_TRUE(ladder.steps[0].runs.empty());
  for (size_t i = 1; i < ladder.steps.size(); ++i) {
    EXPECT_LT(ladder.steps[i].kept, ladder.steps[i - 1].kept) << ladder.steps[i].move;
    EXPECT_LE(ladder.steps[i].peak, ladder.steps[i - 1].peak) << ladder.steps[i].move;
    EXPECT_GE(ladder.steps[i].flops, ladder.steps[i - 1].flops);
  }
  // A stop figure walks a prefix of the same ladder.
  const int64_t stop = ladder.steps[2].kept;
  const auto part = memslim::block_ladder(r.g, memslim::find_segments(r.g), stop, {});
  ASSERT_EQ(part.steps.size(), 3u);
  for (size_t i = 0; i < part.steps.size(); ++i) {
    EXPECT_EQ(part.steps[i].kept, ladder.steps[i].kept);
    EXPECT_EQ(part.steps[i].runs, ladder.steps[i].runs);
  }
  // Runs become rewrites of whole segments, in program order.
  const auto blocks = memslim::ladder_blocks(r.g, ladder, ladder.steps.size() - 1);
  ASSERT_FALSE(blocks.empty());
  for (const auto& b : blocks) EXPECT_TRUE(b.rewrite()) << b.decision.text;
}

TEST(Core, BlockRefusedByTheFrontEndStaysOutOfTheLadder) {
  Residuals r(3);
  auto segs = memslim::find_segments(r.g);
  for (auto& s : segs) s.why = "refused";
  const auto ladder = memslim::block_ladder(r.g, segs, -1, {});
  EXPECT_EQ(ladder.steps.size(), 1u);
}

TEST(Core, RunFxHandsBackTheBudgetLadderAsNodeIds) {
  Residuals r(4);
  memslim::CostPolicy policy;
  EXPECT_FALSE(memslim::run_fx(r.g, {"output-saving-activations"}, policy).ladder);
  policy.memory_budget = 0.5;
  const auto out = memslim::run_fx(r.g, {"output-saving-activations"}, policy);
  ASSERT_TRUE(out.ladder);
  const auto& L = *out.ladder;
  EXPECT_TRUE(L.why.empty()) << L.why;
  EXPECT_EQ(L.segments, 4u);
  EXPECT_TRUE(L.refused.empty());
  ASSERT_GT(L.steps.size(), 2u);
  EXPECT_TRUE(L.steps[0].runs.empty());
  for (size_t i = 1; i < L.steps.size(); ++i) {
    EXPECT_LT(L.steps[i].kept, L.steps[i - 1].kept);
    size_t nodes = 0;
    for (const auto& run : L.steps[i].runs) {
      nodes += run.size();
      for (size_t id : run) { // every id is a node of some block: no mask, no return
        const std::string k = r.g.kind(r.g.node_ref(id));
        EXPECT_TRUE(k == "aten::linear" || k == "aten::mul" || k == "aten::tanh" ||
                    k == "aten::add")
            << k;
      }
    }
    EXPECT_EQ(nodes % 5, 0u); // whole blocks only
  }
}

TEST(Core, GradModeSwitchKeepsABlockOutOfTheFxLadder) {
  Residuals r(3, /*switch_at=*/1);
  memslim::CostPolicy policy;
  policy.memory_budget = 0.5;
  const auto out = memslim::run_fx(r.g, {"output-saving-activations"}, policy);
  ASSERT_TRUE(out.ladder);
  ASSERT_EQ(out.ladder->refused.size(), 1u);
  EXPECT_NE(out.ladder->refused[0].find("switches the grad mode"), std::string::npos)
      << out.ladder->refused[0];
  for (const auto& step : out.ladder->steps)
    for (const auto& run : step.runs)
      for (size_t id : run) EXPECT_NE(r.g.name(r.g.output(r.g.node_ref(id), 0)), "%x1");
}

TEST(Core, BlockFlopsReadAWeightsSizesAndActConsumers) {
  // x [4, 16] -> linear(x, w [16, 16]) -> memslim::act_linear(h, w2, None, "relu", []) + x:
  // 2 x 64 x 16 per product with sizes.
  Builder b;
  auto sized = [&](const std::string& name, std::vector<int64_t> sizes) {
    const size_t v = b.tensor(name, sizes[0] * sizes[1]);
    const_cast<FxGraphView::Value*>(static_cast<const FxGraphView::Value*>(b.g.value_ref(v).p))
        ->sizes = sizes;
    return v;
  };
  const size_t x = sized("x", {4, 16}), w = sized("w", {16, 16}), w2 = sized("w2", {16, 16});
  b.inputs({x, w, w2});
  const size_t h = b.op("aten::linear", "", {x, w, b.none()}, "h");
  const size_t o = b.op("memslim::act_linear", "",
                        {h, w2, b.none(), b.constant(c10::IValue(std::string("relu"))),
                         b.constant(c10::IValue(std::vector<double>{}))},
                        "o");
  const size_t y = b.op("aten::add", "Tensor", {x, o, b.constant(int64_t(1))}, "y");
  b.ret({y});
  const auto segs = memslim::find_segments(b.g);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_GE(segs[0].flops, 2 * (2.0 * 64 * 16)) << segs[0].flops;
}

namespace {

// x [8, 16] -> per block: linear(x, w) -> gelu -> linear(., w') -> + x, with
// sizes (so the products are heavy) and the weights as module state.
struct GeluMlp : Builder {
  size_t out = 0;
  explicit GeluMlp(int blocks) {
    auto sized = [&](const std::string& name, std::vector<int64_t> sizes, bool state) {
      const size_t v = tensor(name, sizes[0] * sizes[1]);
      auto* p =
          const_cast<FxGraphView::Value*>(static_cast<const FxGraphView::Value*>(g.value_ref(v).p));
      p->sizes = sizes;
      p->module_state = state;
      return v;
    };
    size_t x = sized("x", {8, 16}, false);
    std::vector<size_t> in{x}, w;
    for (int b = 0; b < 2 * blocks; ++b)
      in.push_back(w.emplace_back(sized("w" + std::to_string(b), {16, 16}, true)));
    inputs(in);
    const size_t one = constant(int64_t(1));
    for (int b = 0; b < blocks; ++b) {
      const std::string s = std::to_string(b);
      const size_t h = op("aten::linear", "", {x, w[2 * b], none()}, "h" + s, 128);
      const size_t a = op("aten::gelu", "", {h}, "a" + s, 128);
      const size_t o = op("aten::linear", "", {a, w[2 * b + 1], none()}, "o" + s, 128);
      x = op("aten::add", "Tensor", {x, o, one}, "x" + s, 128);
    }
    out = x;
    ret({out});
  }
};

} // namespace

TEST(Core, SplitPiecesCutsABlockAtItsProducts) {
  GeluMlp m(2);
  auto segs = memslim::find_segments(m.g);
  ASSERT_EQ(segs.size(), 2u);
  segs[1].why = "refused by the front end";
  const auto pieces = memslim::split_pieces(m.g, segs);
  // Per block: [linear], [gelu], [linear], [add].
  ASSERT_EQ(pieces.size(), 8u);
  const char* kinds[] = {"aten::linear", "aten::gelu", "aten::linear", "aten::add"};
  for (size_t i = 0; i < pieces.size(); ++i) {
    ASSERT_EQ(pieces[i].fn.nodes.size(), 1u) << i;
    EXPECT_EQ(m.g.kind(pieces[i].fn.nodes[0]), kinds[i % 4]) << i;
    EXPECT_EQ(pieces[i].why.empty(), i < 4) << i; // a piece takes its block's why
    EXPECT_EQ(pieces[i].joins_next, i + 1 < pieces.size()) << i;
    EXPECT_LE(pieces[i].first, pieces[i].last);
  }
  // The add reads the block's input and the second product: both from outside it.
  EXPECT_EQ(pieces[3].fn.external.size(), 2u);
  EXPECT_EQ(m.g.name(pieces[3].fn.output), "%x0");
  EXPECT_GT(pieces[0].flops, 4 * 128.0); // 2 x 128 x 16
  EXPECT_LE(pieces[1].flops, 128.0);     // one per element
  // The products are the heavy pieces; a whole block holds them.
  for (size_t i = 0; i < pieces.size(); ++i) EXPECT_EQ(pieces[i].heavy, i % 2 == 0) << i;
  EXPECT_TRUE(segs[0].heavy);
}

TEST(Core, TagLadderReRunsTheCheapPieceFirst) {
  // gelu keeps its input h; the second linear keeps gelu's output a. As tags,
  // re-running gelu alone frees a (recomputed from h, which stays kept) at one
  // FLOP per element; as an op, gelu's output would stay kept by its reader.
  GeluMlp m(2);
  memslim::CostPolicy policy;
  const auto tags =
      memslim::block_ladder(m.g, memslim::find_segments(m.g), -1, policy, memslim::ApplyAs::Tags);
  ASSERT_TRUE(tags.why.empty()) << tags.why;
  ASSERT_GE(tags.steps.size(), 3u);
  for (size_t k = 1; k < 3; ++k) {
    const auto& runs = tags.steps[k].runs;
    ASSERT_EQ(runs.size(), k);
    for (const auto& r : runs) {
      ASSERT_EQ(r.end - r.begin, 1u);
      EXPECT_EQ(m.g.kind(tags.segments[r.begin].fn.nodes[0]), "aten::gelu");
    }
    EXPECT_EQ(tags.steps[k - 1].kept - tags.steps[k].kept, 128 * 4); // a: 128 floats
    EXPECT_LE(tags.steps[k].peak, tags.steps[k - 1].peak);
  }
  for (size_t k = 1; k < tags.steps.size(); ++k) {
    EXPECT_LT(tags.steps[k].kept, tags.steps[k - 1].kept);
    EXPECT_LE(tags.steps[k].peak, tags.steps[k - 1].peak);
  }
  // Light steps (no product re-run) come first and form a prefix: the gelus,
  // then (the adds after them, where they free anything) before any linear.
  EXPECT_TRUE(tags.steps[0].light && tags.steps[1].light && tags.steps[2].light);
  bool heavy_seen = false;
  for (size_t k = 1; k < tags.steps.size(); ++k) {
    bool holds_product = false;
    for (const auto& r : tags.steps[k].runs)
      for (size_t u = r.begin; u < r.end; ++u)
        holds_product = holds_product || m.g.kind(tags.segments[u].fn.nodes[0]) == "aten::linear";
    EXPECT_EQ(tags.steps[k].light, !holds_product) << k;
    EXPECT_FALSE(heavy_seen && tags.steps[k].light) << k;
    heavy_seen = heavy_seen || holds_product;
  }
  EXPECT_TRUE(heavy_seen); // the ladder goes on past the light ones
  // The op ladder over the same blocks re-runs whole blocks (two products each).
  const auto ops = memslim::block_ladder(m.g, memslim::find_segments(m.g), -1, policy);
  ASSERT_GE(ops.steps.size(), 2u);
  EXPECT_EQ(ops.segments.size(), 2u);
  EXPECT_GT(ops.steps[1].flops, tags.steps[1].flops * 4);
}

TEST(Core, RunFxHandsBackBothLaddersUnderABudget) {
  GeluMlp m(3);
  memslim::CostPolicy policy;
  policy.memory_budget = 0.5;
  const auto out = memslim::run_fx(m.g, {}, policy);
  ASSERT_TRUE(out.ladder && out.pieces);
  EXPECT_EQ(out.ladder->segments, 3u);
  EXPECT_EQ(out.pieces->segments, 3u);
  ASSERT_GE(out.pieces->steps.size(), 2u);
  // The pieces ladder's first run is one gelu node.
  ASSERT_EQ(out.pieces->steps[1].runs.size(), 1u);
  ASSERT_EQ(out.pieces->steps[1].runs[0].size(), 1u);
  EXPECT_EQ(m.g.kind(m.g.node_ref(out.pieces->steps[1].runs[0][0])), "aten::gelu");
}
