//===- decision.cpp - rendering decision records as remark lines ----------===//
//
// The one place remark text is made from a decision record (memslim-opt
// --remarks, lit tests, str() of memslim's Python Decision).
//
//===----------------------------------------------------------------------===//
#include "memslim/core/decision.h"

namespace memslim {

const char* verdict_name(Decision::Verdict v) {
  switch (v) {
    case Decision::Verdict::Rewrote:
      return "rewrote";
    case Decision::Verdict::Kept:
      return "kept";
    case Decision::Verdict::RolledBack:
      return "rolled back";
    case Decision::Verdict::Note:
      return "note";
  }
  return "?";
}

std::string Decision::render() const {
  std::string body;
  switch (verdict) {
    case Verdict::Kept:
      body = "kept " + site + ": " + text;
      break;
    case Verdict::RolledBack:
      body = "rolled back (the graph is as before this pass): " + text;
      break;
    case Verdict::Rewrote:
    case Verdict::Note:
      body = text;
      break;
  }
  return "remark: " + pass + ": " + body;
}

void Remarks::kept(const std::string& pass, const std::string& site, const std::string& reason,
                   Price price, const std::string& rule) {
  add({pass, Decision::Verdict::Kept, site, reason, price, rule});
}

void Remarks::note(const std::string& pass, const std::string& text) {
  add({pass, Decision::Verdict::Note, "", text, {}});
}

std::vector<std::string> Remarks::lines() const {
  std::vector<std::string> out;
  out.reserve(decisions_.size());
  for (const Decision& d : decisions_) out.push_back(d.render());
  return out;
}

} // namespace memslim
