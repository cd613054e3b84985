//===- statistics.cpp - per-pass statistics from the decision records ------===//
//
// What: core/statistics.h: the counts, the reason classes, the text report.
//
//===----------------------------------------------------------------------===//
#include "memslim/core/statistics.h"

#include <algorithm>
#include <cctype>
#include <iomanip>
#include <sstream>

namespace memslim {

std::string reason_class(const std::string& reason) {
  std::string r = reason.substr(0, reason.find(" ("));
  std::string out;
  for (size_t i = 0; i < r.size();) {
    const char c = r[i];
    if (c == '%') { // a value name: %x.13, %out
      out += "%v";
      ++i;
      while (i < r.size() &&
             (std::isalnum(static_cast<unsigned char>(r[i])) || r[i] == '_' || r[i] == '.'))
        ++i;
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               (c == '-' && i + 1 < r.size() &&
                std::isdigit(static_cast<unsigned char>(r[i + 1])) &&
                (i == 0 || r[i - 1] == ' '))) {
      out += 'N';
      ++i;
      while (i < r.size() && (std::isdigit(static_cast<unsigned char>(r[i])) || r[i] == ',' ||
                              r[i] == '.' || r[i] == 'e'))
        ++i;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

std::vector<PassStatistics> pass_statistics(const std::vector<Decision>& decisions) {
  std::vector<PassStatistics> out;
  auto entry = [&](const std::string& pass) -> PassStatistics& {
    for (PassStatistics& s : out)
      if (s.pass == pass) return s;
    out.push_back({});
    out.back().pass = pass;
    return out.back();
  };
  for (const Decision& d : decisions) {
    PassStatistics& s = entry(d.pass);
    switch (d.verdict) {
      case Decision::Verdict::Rewrote:
        ++s.sites;
        ++s.rewritten;
        if (auto f = d.price.freed()) {
          s.bytes_freed += *f;
          s.bytes_before += *d.price.before;
          s.bytes_after += *d.price.after;
        }
        break;
      case Decision::Verdict::Kept: {
        ++s.sites;
        ++s.kept;
        const std::string why = reason_class(d.text);
        auto it = std::find_if(s.kept_by_reason.begin(), s.kept_by_reason.end(),
                               [&](const auto& e) { return e.first == why; });
        if (it == s.kept_by_reason.end())
          s.kept_by_reason.push_back({why, 1});
        else
          ++it->second;
        break;
      }
      case Decision::Verdict::RolledBack:
        ++s.rolled_back;
        break;
      case Decision::Verdict::Note:
        break;
    }
  }
  for (PassStatistics& s : out)
    std::stable_sort(s.kept_by_reason.begin(), s.kept_by_reason.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::string render_statistics(const std::vector<PassStatistics>& stats) {
  const std::string rule(78, '-');
  std::ostringstream o;
  o << "===" << rule.substr(3) << "===\n"
    << "                         ... Pass statistics report ...\n"
    << "===" << rule.substr(3) << "===\n";
  auto line = [&](int64_t n, const char* name, const char* what) {
    o << "  (S) " << std::setw(10) << n << " " << std::left << std::setw(12) << name << std::right
      << " - " << what << "\n";
  };
  for (const PassStatistics& s : stats) {
    o << s.pass << "\n";
    line(s.sites, "sites", "sites decided");
    line(s.rewritten, "rewritten", "sites rewritten");
    line(s.kept, "kept", "sites kept as written");
    if (s.rolled_back) line(s.rolled_back, "rolled-back", "pass runs rolled back");
    line(s.bytes_freed, "bytes-freed", "bytes the rewrites free (the cost model's prices)");
    for (const auto& [why, n] : s.kept_by_reason)
      o << "        " << std::setw(6) << n << " kept: " << why << "\n";
  }
  return o.str();
}

} // namespace memslim
