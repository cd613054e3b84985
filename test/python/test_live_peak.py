"""budget.measure._live_peak, the step-peak predictor's liveness walk over a partition's graph.

What: small graphs traced with fake tensors whose peak is known by hand: a pointwise op
whose only user is pointwise is fused (no buffer), an extern op's output coexists with its
inputs, a pointwise op writes over an input of its size that dies there (Inductor's
in-place reuse), views share their base's storage, outputs stay live, `start`
placeholders are live from the beginning and `resident` ones never count. And
_graph_flops, the added-work figure the planner weighs plans by, against torch's own
flop counter run on real tensors.
Why: the peak target (memslim.compile(peak_memory=)) plans by these figures.
"""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from memslim.budget.measure import _graph_flops, _live_peak, _storage

KB16 = 64 * 64 * 4


def _graph(f, *shapes):
    return make_fx(f, tracing_mode="fake")(*[torch.randn(*s) for s in shapes]).graph


def test_fused_pointwise_extern_and_in_place_reuse():
    def f(x):
        a = torch.relu(x)  # only user pointwise: fused into sin
        b = torch.sin(a)  # read by mm: a buffer
        c = torch.mm(b, b)  # b and c live together
        return torch.cos(c)  # c dies here, same size: written over

    assert _live_peak(_graph(f, (64, 64))) == 2 * KB16


def test_views_share_and_outputs_stay_live():
    def f(x):
        b = torch.mm(x, x)
        v = b.t()  # a view: no buffer
        c = torch.mm(v, x)  # b (through v) and c
        d = torch.mm(x, x)  # c is an output: b dead, c and d live
        return c, d

    assert _live_peak(_graph(f, (64, 64))) == 2 * KB16


def test_start_placeholders_count_and_are_freed_resident_never():
    def f(saved, grad, w):
        g = torch.mm(grad, w)  # saved, grad, g live (w resident)
        h = torch.mm(g, saved)  # saved, g, h (grad dead)
        return h

    graph = _graph(f, (64, 64), (64, 64), (64, 64))
    ph = list(graph.find_nodes(op="placeholder"))
    assert _live_peak(graph, start=ph[:2]) == 3 * KB16
    # w live from the start too: saved, grad, w and g at the first mm.
    assert _live_peak(graph, start=ph) == 4 * KB16
    # w in start but resident (a parameter): as without it.
    resident = {_storage(ph[2].meta["val"])}
    assert _live_peak(graph, start=ph, resident=resident) == 3 * KB16


def test_a_backward_is_walked_in_the_order_that_peaks_least():
    # Inductor reorders a graph for its peak (reorder_for_peak_memory): a backward that,
    # in graph order, makes an input's gradient before the weight's holds the gradient
    # and the saved input together; the weight's first frees the saved input.
    def f(saved, grad, w):
        gi = torch.mm(grad, w)  # graph order: saved, grad, gi
        gw = torch.mm(grad.t(), saved)  # saved, grad, gi, gw: then saved dies
        return gi, gw

    graph = _graph(f, (64, 64), (64, 64), (64, 64))
    ph = list(graph.find_nodes(op="placeholder"))
    resident = {_storage(ph[2].meta["val"])}
    from memslim.budget.measure import _walk_peak

    assert _walk_peak(graph, list(graph.nodes), start=ph[:2], resident=resident) == 4 * KB16
    assert _live_peak(graph, start=ph[:2], resident=resident) == 3 * KB16


def test_an_embeddings_gradient_is_one_buffer():
    # embedding_dense_backward decomposes to full(0) and an index_put that accumulates
    # into it; Inductor writes the sums into the zeros' buffer. Counted as two, a Llama's
    # predicted step peak was 23.7% over its measure (its 62.5 MiB embedding gradient
    # twice; bench/results/peak_target_suite_2026-11-30_00ace8c.md).
    from torch._decomp import get_decompositions

    def f(grad, ids):
        return torch.ops.aten.embedding_dense_backward(grad, ids, 1000, -1, False)

    decomp = get_decompositions([torch.ops.aten.embedding_dense_backward])
    graph = make_fx(f, decomposition_table=decomp, tracing_mode="fake")(
        torch.randn(16, 64), torch.randint(0, 1000, (16,))
    ).graph
    targets = {str(n.target) for n in graph.nodes}
    assert any("index_put" in t for t in targets), targets
    ph = list(graph.find_nodes(op="placeholder"))
    weight_grad = 1000 * 64 * 4
    # The incoming gradient (4 KB) and the weight's gradient, once.
    assert _live_peak(graph, start=ph[:1]) <= weight_grad + 16 * 64 * 4 + 1024


def test_graph_flops_are_torchs_flop_counter_over_the_graph():
    # Matrix products (mm, addmm, bmm) and a convolution count what FlopCounterMode
    # counts running the same function on real tensors; pointwise ops count nothing.
    from torch.utils.flop_counter import FlopCounterMode

    def f(x, w, b, q, img, k):
        h = torch.relu(torch.addmm(b, x, w))  # 2 * 8 * 16 * 32
        y = torch.mm(h, w.t())  # 2 * 8 * 32 * 16
        z = torch.bmm(q, q.transpose(1, 2))  # 2 * 3 * 5 * 4 * 5
        c = torch.nn.functional.conv2d(img, k, padding=1)
        return y.sum() + z.sum() + c.sum()

    args = [torch.randn(*s) for s in ((8, 16), (16, 32), (32,), (3, 5, 4), (2, 3, 8, 8))]
    args.append(torch.randn(4, 3, 3, 3))
    with FlopCounterMode(display=False) as counter:
        f(*args)
    want = counter.get_total_flops()
    assert want == 2 * 8 * 16 * 32 * 2 + 2 * 3 * 5 * 4 * 5 + 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3)
    assert _graph_flops(make_fx(f, tracing_mode="fake")(*args).graph) == want
