//===- graph_text.cpp - a subgraph as the text a memslim op carries ---------===//
//
// See graph_text.h.
//
//===----------------------------------------------------------------------===//
#include "memslim/passes/graph_text.h"

#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/passes/shape_analysis.h>

namespace memslim {

namespace {

void clear_scopes(torch::jit::Block* b) {
  for (torch::jit::Node* n : b->nodes()) {
    n->setScope(c10::make_intrusive<torch::jit::Scope>());
    for (torch::jit::Block* sub : n->blocks()) clear_scopes(sub);
  }
}

// The printer writes a node without outputs as `<indent> = prim::If(...)`,
// which parseIR rejects; it reads `<indent>prim::If(...)` (indents count, as
// in Python).
std::string parseable(const std::string& printed) {
  std::string out;
  size_t at = 0;
  while (at < printed.size()) {
    size_t end = printed.find('\n', at);
    if (end == std::string::npos) end = printed.size();
    std::string line = printed.substr(at, end - at);
    const size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && first > 0 && line.compare(first, 2, "= ") == 0)
      line.erase(first - 1, 3); // the indent ends before the space of " = "
    out += line;
    if (end < printed.size()) out += '\n';
    at = end + 1;
  }
  return out;
}

} // namespace

std::optional<std::string> op_graph_text(const std::shared_ptr<torch::jit::Graph>& g,
                                         std::string* error) {
  clear_scopes(g->block());
  torch::jit::EraseShapeInformation(g);
  std::string text = parseable(g->toString(/*print_source_locations=*/false));
  try { // the op parses this text at run time: check now
    auto check = std::make_shared<torch::jit::Graph>();
    torch::jit::parseIR(text, check.get());
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    if (error) *error = msg.substr(0, msg.find('\n'));
    return std::nullopt;
  }
  return text;
}

} // namespace memslim
