//===- core_cutout_test.cpp - unit tests of the core's cut-out decisions ===//
//
// What: coupling chains (additive, affine, linked by an FX chunk) and recompute blocks
// (segments, the budget ladder, flops, pieces and the tag ladder) over hand-built
// FxGraphViews, and run_fx handing both ladders back.
// Why: the top-level cut-out passes' tests, apart from core_test.cpp's site decisions.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include "core_test_util.h"
#include "memslim/core/couplings.h"
#include "memslim/core/recompute_blocks.h"
#include "memslim/core/recompute_blocks_detail.h"
#include "memslim/core/top_level.h"
#include "memslim/fx/fx_front_end.h"
#include "memslim/fx/fx_graph_view.h"

namespace {

using core_test::Builder;
using memslim::FxGraphView;

// K additive couplings over an FX view: y1 = x1 + tanh(linear(x2, wf)), y2 =
// x2 + tanh(linear(y1, wg)), each block's outputs the next one's inputs.
// `leak`: the first F's linear output is also returned. `chunked`: blocks are
// linked as RevNet links them, chunk(cat([y1, y2], 1), 2, 1), in an FX graph's
// form: chunk's two outputs are the node's own (no ListUnpack). `tupled`: blocks
// are linked as an inlined pair module's `return a, b` links them,
// TupleUnpack(TupleConstruct(y1, y2)); `tuple_read` also returns the first tuple.
struct Couplings : Builder {
  size_t y1 = 0, y2 = 0, leaked = 0, first_tuple = 0;
  explicit Couplings(int blocks, bool leak = false, bool chunked = false, bool tupled = false,
                     bool tuple_read = false) {
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
      if (tupled && b + 1 < blocks) {
        const size_t tuple = g.add_value(FxGraphView::Value{});
        g.add_node("prim::TupleConstruct", std::nullopt, {y1, y2}, {tuple});
        if (b == 0) first_tuple = tuple;
        x1 = tensor("a" + s);
        x2 = tensor("b" + s);
        g.add_node("prim::TupleUnpack", std::nullopt, {tuple}, {x1, x2});
      }
    }
    std::vector<size_t> outs{y1, y2};
    if (leak) outs.push_back(leaked);
    if (tuple_read) outs.push_back(first_tuple);
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

TEST(Core, CouplingChainLinkedThroughAPairModulesTuple) {
  Couplings c(3, /*leak=*/false, /*chunked=*/false, /*tupled=*/true);
  const auto chains = memslim::find_coupling_chains(c.g, {});
  ASSERT_EQ(chains.size(), 1u);
  const auto& ch = chains[0];
  EXPECT_TRUE(ch.rewrite()) << ch.decision.render();
  ASSERT_EQ(ch.blocks.size(), 3u);
  // Direct links: the tuple hands on the same values.
  EXPECT_EQ(ch.link_kinds, (std::vector<int64_t>{0, 0}));
  // 18 block nodes and, per link, TupleConstruct and TupleUnpack.
  EXPECT_EQ(ch.covers.size(), 18u + 2 * 2);
}

TEST(Core, CouplingChainCutWhereATupleIsAlsoReadElsewhere) {
  Couplings c(3, /*leak=*/false, /*chunked=*/false, /*tupled=*/true, /*tuple_read=*/true);
  const auto chains = memslim::find_coupling_chains(c.g, {});
  ASSERT_EQ(chains.size(), 2u);
  EXPECT_EQ(chains[0].blocks.size(), 1u);
  EXPECT_EQ(chains[1].blocks.size(), 2u);
  for (const auto& ch : chains) EXPECT_TRUE(ch.rewrite()) << ch.decision.render();
  EXPECT_EQ(chains[1].link_kinds, (std::vector<int64_t>{0}));
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

namespace {

// Choices of runs over `units` units: none, every run of one to three units, and every
// two disjoint runs of one or two units (touching ones too).
std::vector<std::vector<memslim::BlockRun>> run_choices(size_t units) {
  std::vector<std::vector<memslim::BlockRun>> out{{}};
  for (size_t b = 0; b < units; ++b)
    for (size_t e = b + 1; e <= std::min(units, b + 3); ++e) {
      out.push_back({{b, e}});
      if (e - b > 2) continue;
      for (size_t b2 = e; b2 < units; ++b2)
        for (size_t e2 = b2 + 1; e2 <= std::min(units, b2 + 2); ++e2)
          out.push_back({{b, e}, {b2, e2}});
    }
  return out;
}

// Pricer::freed (local) against the difference of two whole prices, over every pair
// of choices: the ladder scores its moves by the first.
void expect_freed_is_the_prices_difference(const memslim::GraphView& g,
                                           const std::vector<memslim::Segment>& segs,
                                           memslim::ApplyAs as) {
  const memslim::Top t(g);
  const memslim::blocks_detail::Pricer pricer(t, segs, as);
  ASSERT_TRUE(pricer.why().empty() && pricer.local());
  const auto choices = run_choices(segs.size());
  ASSERT_GT(choices.size(), 20u);
  size_t nonzero = 0;
  for (const auto& a : choices) {
    const int64_t kept_a = pricer.price(a).kept;
    for (const auto& b : choices) {
      const int64_t want = kept_a - pricer.price(b).kept;
      ASSERT_EQ(pricer.freed(a, b), want) << a.size() << " -> " << b.size();
      nonzero += want != 0;
    }
  }
  EXPECT_GT(nonzero, choices.size()); // the choices differ in what they keep
}

} // namespace

TEST(Core, PricersLocalFreedBytesAreTheWholePricesDifference) {
  Residuals r(4);
  expect_freed_is_the_prices_difference(r.g, memslim::find_segments(r.g), memslim::ApplyAs::Op);
  GeluMlp m(3);
  const memslim::Top t(m.g);
  const auto pieces = memslim::blocks_detail::pieces_of(t, memslim::find_segments(m.g));
  ASSERT_GE(pieces.size(), 9u);
  expect_freed_is_the_prices_difference(m.g, pieces, memslim::ApplyAs::Tags);
  expect_freed_is_the_prices_difference(m.g, pieces, memslim::ApplyAs::Op);
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
