//===- site_loop.h - the loop every site pass runs, in every front end -----===//
//
// What: for_each_site, the driver of a site pass (one decision per matching
// node): the sites found on the graph as the pass starts, each one still in
// the graph decided on the graph as the earlier rewrites left it, a Rewrote
// decision handed to the front end's rewriter (which asks its gate and edits
// the graph, or turns the decision into Kept with the gate's reason), every
// decision recorded once. The core's decision functions are the passes; a
// front end supplies `alive` (is the node still there), `rewrite` and `record`.
// Why: this loop used to be written out in each TorchScript adapter and again
// in the FX front end, each copy with its own small differences.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

namespace site_loop_detail {
template <class D>
D* get(D& d) {
  return &d;
}
template <class D>
D* get(std::optional<D>& d) {
  return d ? &*d : nullptr;
}
} // namespace site_loop_detail

// `is_site(g, n)` picks the sites; `decide(g, n)` returns the pass's decision
// (a struct with a `decision` record and `rewrite()`, or an optional of one:
// nullopt says nothing); `alive(n)` whether an earlier rewrite left n in the
// graph; `rewrite(site, d)` applies a Rewrote decision through the front end's gate
// and returns whether it recorded the decision itself (the TorchScript gate
// does); `record(Decision)` keeps the rest. With `skip_notes`, Note decisions
// (the site turned out to be none) are not recorded.
template <class IsSite, class Decide, class Alive, class Rewrite, class Record>
void for_each_site(const GraphView& g, IsSite is_site, Decide decide, Alive alive, Rewrite rewrite,
                   Record record, bool skip_notes = false) {
  std::vector<NodeRef> sites;
  for (NodeRef n : g.nodes()) // every block: If branches too
    if (is_site(g, n)) sites.push_back(n);
  for (NodeRef site : sites) {
    if (!alive(site)) continue;
    auto result = decide(g, site);
    auto* d = site_loop_detail::get(result);
    if (!d) continue;
    if (skip_notes && d->decision.verdict == Decision::Verdict::Note) continue;
    if (d->rewrite() && rewrite(site, *d)) continue;
    record(std::move(d->decision));
  }
}

} // namespace memslim
