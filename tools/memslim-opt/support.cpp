//===- support.cpp - memslim-opt's errors and text helpers ----------------===//
//
// What: fail() and its one printable line, the string helpers, and the
// reading of torch's exception texts (backtraces, TorchScript tracebacks, the
// IR parser's source quotes, internal asserts) down to one line.
// Why: torch's errors are multi-line and may quote corrupt input bytes; the
// tool promises one `memslim-opt: error: ...` line whatever failed.
//
//===----------------------------------------------------------------------===//
#include "support.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace memslim_opt {

std::string g_partial_output;
bool g_quick_exit = false;

std::string printable(const std::string& text) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  auto escape = [&](unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == '\r' || c == '\t') {
      out += ' ';
      ++i;
    } else if (c < 0x20 || c == 0x7f) {
      escape(c);
      ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else {
      // A well-formed UTF-8 sequence (no overlongs, no surrogates) is kept.
      const size_t len = c >= 0xc2 && c <= 0xdf   ? 2
                         : c >= 0xe0 && c <= 0xef ? 3
                         : c >= 0xf0 && c <= 0xf4 ? 4
                                                  : 0;
      uint32_t cp = len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
      bool ok = len != 0 && i + len <= n;
      for (size_t k = 1; ok && k < len; ++k) {
        const auto d = static_cast<unsigned char>(text[i + k]);
        ok = (d & 0xc0) == 0x80;
        cp = (cp << 6) | (d & 0x3f);
      }
      ok = ok && !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
           !(cp >= 0xd800 && cp <= 0xdfff) && !(cp >= 0x80 && cp <= 0x9f) && cp != 0x2028 &&
           cp != 0x2029;
      if (ok) {
        out.append(text, i, len);
        i += len;
      } else {
        escape(c);
        ++i;
      }
    }
  }
  return out;
}

[[noreturn]] void exit_now(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (g_quick_exit) _exit(code);
  std::exit(code);
}

[[noreturn]] void fail(const std::string& msg) {
  if (!g_partial_output.empty()) std::remove(g_partial_output.c_str());
  const std::string line = printable(msg);
  std::cout.flush();
  std::cerr << "memslim-opt: error: " << line << "\n";
  exit_now(1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

// One line out of an exception's text. torch's texts are multi-line: c10::Error
// carries a backtrace, the interpreter wraps the real error in a TorchScript
// traceback ("The following operation failed ... RuntimeError: <the error>"),
// and the IR parser's ErrorReport starts with an empty line, then the message,
// then the source with a "~~~ <--- HERE" marker. For the parser, `source` (the
// text that was parsed) turns the marker into "line L, column C".
std::string one_line(const std::exception& e, const std::string& source) {
  std::string text;
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e))
    text = ce->what_without_backtrace();
  else
    text = e.what();
  const std::vector<std::string> lines = lines_of(text);
  std::string msg;
  if (text.find("The following operation failed in the TorchScript interpreter") !=
      std::string::npos) {
    for (auto it = lines.rbegin(); it != lines.rend(); ++it)
      if (!trim(*it).empty()) {
        msg = trim(*it);
        break;
      }
    // "RuntimeError: x" -> "x"
    const auto colon = msg.find(": ");
    if (colon != std::string::npos && colon < 40 && msg.find(' ') > colon &&
        msg.substr(0, colon).find("Error") != std::string::npos)
      msg = msg.substr(colon + 2);
  } else {
    size_t first = 0;
    while (first < lines.size() && trim(lines[first]).empty()) ++first;
    msg = first < lines.size() ? trim(lines[first]) : "";
    // Parser errors: the source block above "<--- HERE" ends with the bad line.
    size_t marker = lines.size();
    for (size_t i = first + 1; i < lines.size(); ++i)
      if (lines[i].find("<--- HERE") != std::string::npos) {
        marker = i;
        break;
      }
    if (!source.empty() && marker < lines.size() && marker > first + 1) {
      const std::vector<std::string> src = lines_of(source);
      const size_t k = marker - (first + 1);
      std::vector<size_t> hits;
      for (size_t end = k; end <= src.size(); ++end) {
        bool same = true;
        for (size_t j = 0; j < k && same; ++j) same = src[end - k + j] == lines[first + 1 + j];
        if (same) hits.push_back(end); // 1-based line number of the block's last line
      }
      const auto col = lines[marker].find('~');
      if (hits.size() == 1) {
        if (!msg.empty() && msg.back() == ':') msg.pop_back();
        msg = "line " + std::to_string(hits[0]) +
              (col != std::string::npos ? ", column " + std::to_string(col + 1) : "") + ": " + msg;
      }
    }
    if (!msg.empty() && msg.back() == ':') msg.pop_back();
  }
  // c10's allocator: "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: ..."
  if (starts_with(msg, "[enforce fail at ")) {
    const auto close = msg.find("] ");
    const auto dot = close == std::string::npos ? close : msg.find(". ", close);
    if (dot != std::string::npos) msg = msg.substr(dot + 2);
  }
  if (msg.empty()) msg = "(no message)";
  return msg;
}

bool parse_int(const std::string& s, long long& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtoll(s.c_str(), &end, 10);
  return errno == 0 && *end == '\0';
}

bool parse_double(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return *end == '\0';
}

// One line for the exception std::terminate was called for (inside a
// terminate handler). c10_only: read only a c10::Error's message; what() of
// others (torch's ErrorReport) may throw again.
std::string terminating_exception(bool c10_only) {
  auto p = std::current_exception();
  if (!p) return "std::terminate";
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    if (!c10_only) return one_line(e);
    if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
      const auto lines = lines_of(ce->what_without_backtrace());
      return lines.empty() ? "(no message)" : trim(lines[0]);
    }
  } catch (...) {
  }
  return c10_only ? "unknown exception" : "std::terminate";
}

// torch's own consistency checks ("COND INTERNAL ASSERT FAILED at "FILE":N,
// please report a bug to PyTorch. MSG") that its readers (archive loader, IR
// parser) hit on bad input: the input's fault, not a torch bug. MSG, or the
// failed condition; "" when `msg` is not such a check.
std::string torch_check_detail(const std::string& msg) {
  const auto assert_at = msg.find(" INTERNAL ASSERT FAILED");
  if (assert_at == std::string::npos) return "";
  const std::string tag = "please report a bug to PyTorch.";
  const auto tag_at = msg.find(tag);
  std::string detail = tag_at == std::string::npos ? "" : trim(msg.substr(tag_at + tag.size()));
  if (detail.empty()) detail = "torch's check '" + msg.substr(0, assert_at) + "' failed";
  return detail;
}

} // namespace memslim_opt
