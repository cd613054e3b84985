//===- support.h - memslim-opt's errors and text helpers --------*- C++ -*-===//
//
// What: how memslim-opt fails (one printable `memslim-opt: error: ...` line,
// exit code 1, the partial output removed) and the string helpers every part
// of the tool uses: one line out of torch's multi-line exception texts, the
// split / trim / number parsing of flags and IR text.
// Why here: the failure contract is the tool's, not any one part's; every file
// of tools/memslim-opt/ fails through fail() so that the contract holds alike.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <exception>
#include <string>
#include <vector>

namespace memslim_opt {

// A path to remove if the process fails after creating it (the -o temporary).
extern std::string g_partial_output;

// Set in a --fork-server child: exit without running static destructors (torch's
// take ~0.1 s unregistering every operator; the streams are flushed first).
extern bool g_quick_exit;

// `text` as one printable line: newlines and tabs become spaces; other control bytes,
// bytes that are not UTF-8 and the code points other tools read as line breaks
// (U+0085, U+2028, U+2029; Python's str.splitlines also splits at \x1c-\x1e) are
// written as \xNN. torch quotes the bytes of a corrupt input in its errors.
std::string printable(const std::string& text);

// Flushes the streams and exits (quickly in a fork-server child).
[[noreturn]] void exit_now(int code);

// The one error line, then exit 1 (the partial output removed first).
[[noreturn]] void fail(const std::string& msg);

std::vector<std::string> split(const std::string& s, char sep);
bool starts_with(const std::string& s, const std::string& p);
std::string trim(const std::string& s);
std::vector<std::string> lines_of(const std::string& s);

// One line out of an exception's text (see support.cpp). For the IR parser's
// errors, `source` (the text that was parsed) gives "line L, column C".
std::string one_line(const std::exception& e, const std::string& source = "");

bool parse_int(const std::string& s, long long& v);
bool parse_double(const std::string& s, double& v);

// One line for the exception std::terminate was called for (inside a
// terminate handler). c10_only: read only a c10::Error's message; what() of
// others (torch's ErrorReport) may throw again.
std::string terminating_exception(bool c10_only);

// torch's own consistency checks ("COND INTERNAL ASSERT FAILED at "FILE":N,
// please report a bug to PyTorch. MSG") that its readers (archive loader, IR
// parser) hit on bad input: the input's fault, not a torch bug. MSG, or the
// failed condition; "" when `msg` is not such a check.
std::string torch_check_detail(const std::string& msg);

} // namespace memslim_opt
