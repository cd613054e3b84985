//===- core_test.cpp - unit tests of the front-end-neutral decision core ---===//
//
// What: the saved-tensor rules, the output-saving and functionalize decisions,
// the view gate and run_fx over hand-built FxGraphViews (no Python, no FX), and
// the same decision over a JitGraphView of the equivalent TorchScript graph:
// both views give the same record; recompute regions (formation, price with
// who requires grad, placement, the op's text) over an FxGraphView. Couplings and
// recompute blocks: core_cutout_test.cpp.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/script.h>

#include "core_test_util.h"
#include "memslim/core/functionalize.h"
#include "memslim/core/output_saving.h"
#include "memslim/core/output_saving_norms.h"
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

using core_test::Builder;
using core_test::node_named;

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

// A layer norm whose output y is read by `reader` (TorchScript IR lines using
// %y, %w, %c), as a JitGraphView; the norm's output-saving decision.
struct NormSite {
  std::shared_ptr<torch::jit::Graph> graph = std::make_shared<torch::jit::Graph>();
  std::unique_ptr<memslim::JitGraphView> view;
  memslim::NodeRef norm;
  memslim::ValueRef y;
  explicit NormSite(const std::string& reader) {
    torch::jit::parseIR(R"IR(
graph(%x : Float(8, 4, 16, strides=[64, 16, 1], device=cpu),
      %w : Float(16, 16, strides=[16, 1], device=cpu),
      %c : bool):
  %none : NoneType = prim::Constant()
  %eps : float = prim::Constant[value=1.0000000000000001e-05]()
  %f : bool = prim::Constant[value=0]()
  %zero : int = prim::Constant[value=0]()
  %one : int = prim::Constant[value=1]()
  %shape : int[] = prim::Constant[value=[16]]()
  %s : Float(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::add(%x, %x, %one)
  %y : Float(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::layer_norm(%s, %shape, %none, %none, %eps, %f)
)IR" + reader,
                        graph.get());
    view = std::make_unique<memslim::JitGraphView>(graph);
    norm = node_named_in(*view, "aten::layer_norm");
    for (auto n : view->nodes())
      if (view->kind(n) == "aten::layer_norm") y = view->output(n, 0);
  }
  static memslim::NodeRef node_named_in(const memslim::GraphView& g, const std::string& kind) {
    for (auto n : g.nodes())
      if (g.kind(n) == kind) return n;
    return {};
  }
  bool kept(bool surely) const {
    return memslim::saved::kept_by_other(*view, y, {norm}, nullptr, surely);
  }
  memslim::NormDecision decide() const {
    return memslim::decide_output_saving_norm(*view, norm, {});
  }
};

TEST(Core, LinearKeepsACopyOfANonContiguousInput) {
  // nn.MultiheadAttention (batch_first) projects `query.transpose(1, 0)`: a 3-D
  // non-contiguous view, which linear folds to 2-D by a copying reshape and
  // keeps that copy, none of the norm output's bytes (test_optimize.py's
  // TransformerEncoder: 1 MiB per layer priced free and kept). It may keep the
  // view itself (a DifferentiableGraph's linear), so it is no sure keeper. A
  // contiguous view is kept as the norm output's own storage.
  NormSite t(R"IR(
  %q : Float(4, 8, 16, strides=[16, 64, 1], device=cpu) = aten::transpose(%y, %zero, %one)
  %o : Float(4, 8, 16, strides=[128, 16, 1], device=cpu) = aten::linear(%q, %w, %none)
  return (%o))IR");
  EXPECT_TRUE(memslim::saved::keeps_copy_of_input(
      *t.view, NormSite::node_named_in(*t.view, "aten::linear"), 0));
  EXPECT_TRUE(t.kept(false));
  EXPECT_FALSE(t.kept(true));
  EXPECT_EQ(t.decide().decision.verdict, Decision::Verdict::Kept);
  NormSite v(R"IR(
  %sz : int[] = prim::Constant[value=[32, 16]]()
  %q : Float(32, 16, strides=[16, 1], device=cpu) = aten::view(%y, %sz)
  %o : Float(32, 16, strides=[16, 1], device=cpu) = aten::linear(%q, %w, %none)
  %o2 : Float(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::linear(%y, %w, %none)
  return (%o, %o2))IR");
  EXPECT_FALSE(memslim::saved::keeps_copy_of_input(
      *v.view, NormSite::node_named_in(*v.view, "aten::linear"), 0));
  EXPECT_TRUE(v.kept(false));
  EXPECT_TRUE(v.kept(true));
  EXPECT_TRUE(v.decide().rewrite()) << v.decide().decision.text;
}

TEST(Core, AutocastCastToAnotherDtypeIsACopy) {
  // TorchScript's autocast pass casts the norm output to bf16 for the linear:
  // `_autocast_to_reduced_precision(Tensor(a) self, ...) -> Tensor(a)` says
  // alias because a same-dtype cast returns its input, but Float -> BFloat16
  // is a new tensor: the linear keeps the copy, nobody keeps y (the MLP's GELU
  // before fc2 was priced -507,904 B and measured +17,624 B). The gate's alias
  // rules still see a possible alias.
  const std::string cast = R"IR(
  %no : bool = prim::Constant[value=0]()
  %yes : bool = prim::Constant[value=1]()
  %bf : int = prim::Constant[value=15]()
  %wb : BFloat16(16, 16, strides=[16, 1], device=cpu) = aten::_autocast_to_reduced_precision(%w, %no, %yes, %bf, %bf)
)IR";
  NormSite copy(cast + R"IR(
  %q : BFloat16(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::_autocast_to_reduced_precision(%y, %no, %yes, %bf, %bf)
  %o : BFloat16(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::linear(%q, %wb, %none)
  return (%o))IR");
  const auto c = NormSite::node_named_in(*copy.view, "aten::linear");
  const auto q = copy.view->producer(copy.view->input(c, 0));
  EXPECT_TRUE(memslim::saved::casts_to_another_dtype(*copy.view, q));
  EXPECT_FALSE(memslim::saved::is_view_of_input(*copy.view, q, 0));
  EXPECT_TRUE(memslim::saved::may_alias_input(*copy.view, q, 0));
  EXPECT_FALSE(copy.kept(false));
  EXPECT_FALSE(copy.kept(true));
  // A no-op cast (the value already bf16, or a Float -> Float one) returns its
  // input: the linear keeps y's own storage.
  NormSite same(cast + R"IR(
  %q : Float(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::_autocast_to_full_precision(%y, %no, %yes)
  %o : Float(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::linear(%q, %w, %none)
  return (%o))IR");
  const auto s =
      same.view->producer(same.view->input(NormSite::node_named_in(*same.view, "aten::linear"), 0));
  EXPECT_FALSE(memslim::saved::casts_to_another_dtype(*same.view, s));
  EXPECT_TRUE(memslim::saved::is_view_of_input(*same.view, s, 0));
  EXPECT_TRUE(same.kept(true));
}

TEST(Core, A16BitLinearKeepsItsCastCopyOfAFloatInput) {
  // A graph traced above autocast (torch.compile, torch.export) shows no casts:
  // the linear reads the float32 norm output and makes bf16. It keeps
  // autocast's bf16 copy, not y: y is kept by nobody, and output-saving-norms
  // would keep the float32 y on top (a decoder block: +31,744 B under Inductor).
  NormSite b(R"IR(
  %o : BFloat16(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::linear(%y, %w, %none)
  return (%o))IR");
  const auto lin = NormSite::node_named_in(*b.view, "aten::linear");
  EXPECT_TRUE(memslim::saved::keeps_input(*b.view, lin, 0));
  EXPECT_TRUE(memslim::saved::keeps_cast_copy_of_input(*b.view, lin, 0));
  EXPECT_FALSE(b.kept(false));
  EXPECT_FALSE(b.kept(true));
  EXPECT_FALSE(b.decide().rewrite()) << b.decide().decision.text;
  // In float32 it keeps y itself.
  NormSite f(R"IR(
  %o : Float(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::linear(%y, %w, %none)
  return (%o))IR");
  EXPECT_FALSE(memslim::saved::keeps_cast_copy_of_input(
      *f.view, NormSite::node_named_in(*f.view, "aten::linear"), 0));
  EXPECT_TRUE(f.kept(true));
  EXPECT_TRUE(f.decide().rewrite()) << f.decide().decision.text;
}

TEST(Core, NormOutputKeptOnlyInABranchIsNotKeptAnyway) {
  // nn.TransformerEncoder's last norm output: its only keeper is the
  // nested-tensor branch's to_padded_tensor, which a training step never runs
  // (measured: the output-saving norm there kept 1 MiB more). Any reader counts
  // for "kept by another"; for "kept anyway, so free to keep", only readers
  // that run whenever y is made.
  NormSite b(R"IR(
  %r : Tensor = prim::If(%c)
    block0():
      %o : Float(8, 4, 16, strides=[64, 16, 1], device=cpu) = aten::linear(%y, %w, %none)
      -> (%o)
    block1():
      -> (%y)
  return (%r))IR");
  EXPECT_TRUE(b.kept(false));
  EXPECT_FALSE(b.kept(true));
  const auto d = b.decide();
  EXPECT_EQ(d.decision.verdict, Decision::Verdict::Kept);
  EXPECT_NE(d.decision.text.find("output not saved by any consumer"), std::string::npos)
      << d.decision.text;
}

} // namespace
