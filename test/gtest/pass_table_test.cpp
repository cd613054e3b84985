//===- pass_table_test.cpp - the pass table, pipelines and statistics ------===//
//
// What: unit tests of the core's pass table (every row has a lit file and, in
// each front end, an implementation or a reason), the pipelines as each front
// end runs them, and the statistics counted from decision records.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/pass_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "memslim/core/statistics.h"
#include "memslim/fx/fx_front_end.h"
#include "memslim/jit/pass.h"

#ifndef MEMSLIM_SOURCE_DIR
#error "MEMSLIM_SOURCE_DIR must name the source tree (test/CMakeLists.txt)"
#endif

namespace memslim {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST(PassTable, EveryRowHasALitFileAndATorchScriptForm) {
  ASSERT_FALSE(pass_table().empty());
  for (const PassSpec& p : pass_table()) {
    const std::string lit = std::string(MEMSLIM_SOURCE_DIR) + "/lit-tests/" + p.flag + ".ir";
    if (std::string(p.flag) != "test-perturb-outputs")
      EXPECT_TRUE(std::ifstream(lit).good()) << "no lit file for " << p.flag;
    EXPECT_NE(find_pass(p.flag), nullptr) << p.flag;
    for (const char* o : p.options) EXPECT_NE(find_policy_option(o), nullptr) << p.flag << " " << o;
  }
  EXPECT_EQ(registered_passes().size(), pass_table().size());
}

TEST(PassTable, PipelineStepsNamePassesAndFrontEndsDifferWhereTheStepSays) {
  const PipelineSpec* p = find_pipeline_spec("memslim-default");
  ASSERT_NE(p, nullptr);
  const auto jit = p->passes(FrontEnd::Jit), fx = p->passes(FrontEnd::Fx),
             compile = p->passes(FrontEnd::Compile);
  EXPECT_EQ(jit.size(), p->steps.size());
  for (const PipelineStep& s : p->steps) {
    ASSERT_NE(find_pass_spec(s.pass), nullptr) << s.pass;
    EXPECT_NE(std::string(s.why), "") << s.pass;
    EXPECT_EQ(contains(fx, s.pass), *s.fx_skip == '\0') << s.pass;
    if (*s.fx_skip == '\0' && *s.compile_skip == '\0') EXPECT_TRUE(contains(compile, s.pass));
  }
  EXPECT_FALSE(contains(fx, "cleanup"));
  EXPECT_FALSE(contains(fx, "invertible-couplings"));
  EXPECT_TRUE(contains(fx, "fuse-activation-dropout"));
  EXPECT_FALSE(contains(compile, "fuse-activation-dropout"));
  EXPECT_EQ(fx, fx_default_passes());
}

TEST(PassTable, ResolveNamesTheUnknown) {
  EXPECT_THROW(resolve_pipeline({}, "no-such-pipeline", FrontEnd::Fx), std::invalid_argument);
  EXPECT_THROW(resolve_pipeline({"no-such-pass"}, "", FrontEnd::Jit), std::invalid_argument);
  EXPECT_EQ(resolve_pipeline({"cleanup"}, "", FrontEnd::Jit), std::vector<std::string>{"cleanup"});
}

TEST(Statistics, CountsPerPassAndKeptByReasonClass) {
  std::vector<Decision> ds;
  ds.push_back({"a", Decision::Verdict::Rewrote, "s1", "rewrote", {100, 40, {}}});
  ds.push_back({"a", Decision::Verdict::Kept, "s2", "frees 0 B, below the 1 B minimum", {}});
  ds.push_back({"a", Decision::Verdict::Kept, "s3", "frees -12 B, below the 1 B minimum (x)", {}});
  ds.push_back({"b", Decision::Verdict::Kept, "s4", "%x.13 is read by aten::cat", {}});
  ds.push_back({"a", Decision::Verdict::Note, "", "a note", {}});
  ds.push_back({"b", Decision::Verdict::RolledBack, "", "boom", {}});
  const auto st = pass_statistics(ds);
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].pass, "a");
  EXPECT_EQ(st[0].sites, 3);
  EXPECT_EQ(st[0].rewritten, 1);
  EXPECT_EQ(st[0].kept, 2);
  EXPECT_EQ(st[0].bytes_freed, 60);
  EXPECT_EQ(st[0].bytes_before, 100);
  EXPECT_EQ(st[0].bytes_after, 40);
  ASSERT_EQ(st[0].kept_by_reason.size(), 1u);
  EXPECT_EQ(st[0].kept_by_reason[0].first, "frees N B, below the N B minimum");
  EXPECT_EQ(st[0].kept_by_reason[0].second, 2);
  EXPECT_EQ(st[1].rolled_back, 1);
  EXPECT_EQ(st[1].kept_by_reason[0].first, "%v is read by aten::cat");
  const std::string text = render_statistics(st);
  EXPECT_NE(text.find("Pass statistics report"), std::string::npos);
  EXPECT_NE(text.find("bytes-freed"), std::string::npos);
}

} // namespace
} // namespace memslim
