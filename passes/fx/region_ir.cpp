//===- region_ir.cpp - a recompute region as its op's TorchScript IR text --===//
//
// What: region_ir (fx/region_ir.h): the region's nodes copied into a fresh
// torch::jit::Graph (inputs, constants, outputs in the decision's order),
// printed, and parsed back as the op will parse it.
//
//===----------------------------------------------------------------------===//
#include "memslim/fx/region_ir.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/ir/irparser.h>

#include <memory>
#include <unordered_map>

namespace memslim {

std::optional<std::string> region_ir(const GraphView& g, const Region& r, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<std::string> {
    if (error) *error = why;
    return std::nullopt;
  };
  auto sub = std::make_shared<torch::jit::Graph>();
  std::unordered_map<const void*, torch::jit::Value*> env;
  for (ValueRef v : r.inputs) {
    torch::jit::Value* in = sub->addInput();
    in->setType(c10::TensorType::get());
    env[v.p] = in;
  }
  for (NodeRef n : r.nodes) {
    std::vector<torch::jit::Value*> ins;
    for (size_t i = 0; i < g.num_inputs(n); ++i) {
      const ValueRef v = g.input(n, i);
      auto it = env.find(v.p);
      if (it != env.end()) {
        ins.push_back(it->second);
      } else if (is_region_constant(g, v)) {
        ins.push_back(sub->insertConstant(*g.constant(v)));
      } else {
        return fail(g.name(v) + " is neither a region input nor a constant");
      }
    }
    torch::jit::Node* c =
        sub->appendNode(sub->create(c10::Symbol::fromQualString(g.kind(n)), ins, 1));
    c->output()->setType(c10::TensorType::get());
    if (!c->maybeSchema())
      return fail("TorchScript has no " + g.kind(n) + " for these argument types");
    env[g.output(n, 0).p] = c->output();
  }
  for (ValueRef o : r.outputs) sub->registerOutput(env.at(o.p));
  const std::string ir = sub->toString(/*print_source_locations=*/false);
  try { // the op parses this text at run time: check now
    auto check = std::make_shared<torch::jit::Graph>();
    torch::jit::parseIR(ir, check.get());
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    return fail("its graph text does not parse back (" + msg.substr(0, msg.find('\n')) + ")");
  }
  return ir;
}

} // namespace memslim
