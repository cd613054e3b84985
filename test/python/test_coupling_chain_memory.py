"""memslim::coupling_chain's backward lets go as it walks (issue 45): each block's tensors are
released before the next block's re-run, so the backward's peak is one function's re-run plus
the pair being rebuilt and its two gradients, and grows with the chain's length only by the
parameter gradients it returns. And what that release must not change: gradients where the
engine hands both halves the same gradient tensor or a function passes its cotangent through,
a second backward under retain_graph, the in-place-modification error, saved-tensor hooks.

Peaks: the profiler's [memory] events (memslim.probe.step_peak_bytes) around loss.backward(),
counted from the live bytes when it starts; F is linear(64 -> 128)-ReLU-linear(128 -> 64) on
2048 rows, a half (2048 x 64 fp32) is 512 KiB.
"""

from __future__ import annotations

import pytest
import torch

import memslim
from memslim.probe import step_peak_bytes

N, D, H = 2048, 64, 128
HALF = N * D * 4
FN_PARAM_BYTES = 2 * H * D * 4  # w1 (H x D) and w2 (D x H), fp32

MLP = (
    "graph(%x : Tensor, %w1 : Tensor, %w2 : Tensor):\n  %n : NoneType = prim::Constant()\n"
    "  %h : Tensor = aten::linear(%x, %w1, %n)\n  %r : Tensor = aten::relu(%h)\n"
    "  %y : Tensor = aten::linear(%r, %w2, %n)\n  return (%y)\n"
)
# x + w: the input's gradient and w's are the cotangent itself (no new tensor).
ADD = (
    "graph(%x : Tensor, %w : Tensor):\n  %one : int = prim::Constant[value=1]()\n"
    "  %y : Tensor = aten::add(%x, %w, %one)\n  return (%y)\n"
)
TANH = (
    "graph(%x : Tensor, %w : Tensor):\n  %n : NoneType = prim::Constant()\n"
    "  %h : Tensor = aten::linear(%x, %w, %n)\n  %y : Tensor = aten::tanh(%h)\n  return (%y)\n"
)


def mlp(x, w1, w2):
    return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1)), w2)


def mlp_chain(k, dtype=torch.float32):
    torch.manual_seed(0)
    x1 = torch.randn(N, D, dtype=dtype, requires_grad=True)
    x2 = torch.randn(N, D, dtype=dtype, requires_grad=True)
    ws = []
    for _ in range(2 * k):
        ws += [
            (torch.randn(H, D, dtype=dtype) / 8).requires_grad_(),
            (torch.randn(D, H, dtype=dtype) / 11).requires_grad_(),
        ]
    return x1, x2, ws


def call_mlp_chain(x1, x2, ws):
    k = len(ws) // 4
    return torch.ops.memslim.coupling_chain(
        x1, x2, ws, [MLP] * (2 * k), [2] * (2 * k), [0, 0, 0] * (k - 1)
    )


def backward_peak(k):
    """The chain's backward peak above the live bytes when it starts, with a loss whose
    gradients are full tensors (a sum's would be expanded scalars)."""
    x1, x2, ws = mlp_chain(k)
    u1, u2 = torch.randn(N, D), torch.randn(N, D)
    for _ in range(2):  # the first call measures drift and keeps every block's input
        y1, y2 = call_mlp_chain(x1, x2, ws)
        ((y1 * u1).sum() + (y2 * u2).sum()).backward()
    y1, y2 = call_mlp_chain(x1, x2, ws)
    loss = (y1 * u1).sum() + (y2 * u2).sum()
    del y1, y2
    return step_peak_bytes(loss.backward)


def one_function_step_peak():
    """What one function's re-run needs: its forward and backward with grad on one half
    (input gradient and parameter gradients included), eagerly."""
    x1, _, ws = mlp_chain(1)
    cot = torch.randn(N, D)

    def step():
        xx = x1.detach().requires_grad_()
        mlp(xx, ws[0], ws[1]).backward(cot)

    return step_peak_bytes(step)


@pytest.mark.parametrize("k", [4, 8])
def test_backward_peak_is_one_rerun_plus_the_pair_and_its_gradients(k):
    """Bound: one function's re-run (its own step peak) + the pair being rebuilt and its
    two gradients (4 halves) + the other functions' parameter gradients, which backward
    returns. Before the walk let go (2026-11-29, dbaa142) the chain's outputs and the
    incoming gradients lived through the whole backward: K=4 14.94 halves, K=8 15.44,
    against bounds of 11.94 and 12.94; now 10.94 and 11.94."""
    bound = one_function_step_peak() + 4 * HALF + (2 * k - 1) * FN_PARAM_BYTES
    peak = backward_peak(k)
    assert peak <= bound, (peak / HALF, bound / HALF)


def test_backward_peak_grows_only_by_the_parameter_gradients():
    """K=1 to K=8: 14 more functions' parameter gradients (1.75 halves) and nothing else
    (before: 3.25 halves)."""
    grow = backward_peak(8) - backward_peak(1)
    assert grow <= 14 * FN_PARAM_BYTES + 16 * 1024, grow / HALF


def eager_chain(x1, x2, fns, ws_per_fn):
    for b in range(len(fns) // 2):
        x1 = x1 + fns[2 * b](x2, *ws_per_fn[2 * b])
        x2 = x2 + fns[2 * b + 1](x1, *ws_per_fn[2 * b + 1])
    return x1, x2


def mixed_chain(k=3):
    """F: linear-tanh; G: x + w (the cotangent passes through to x and to w), fp64."""
    torch.manual_seed(0)
    x1 = torch.randn(16, 8, dtype=torch.double, requires_grad=True)
    x2 = torch.randn(16, 8, dtype=torch.double, requires_grad=True)
    ws = []
    for _ in range(k):
        ws += [
            (torch.randn(8, 8, dtype=torch.double) / 3).requires_grad_(),
            torch.randn(16, 8, dtype=torch.double, requires_grad=True),
        ]
    texts = [TANH, ADD] * k
    return x1, x2, ws, texts


def run_mixed(x1, x2, ws, texts):
    k = len(texts) // 2
    return torch.ops.memslim.coupling_chain(x1, x2, ws, texts, [1] * (2 * k), [0, 0, 0] * (k - 1))


def eager_mixed(x1, x2, ws):
    fns = [lambda x, w: torch.tanh(torch.nn.functional.linear(x, w)), lambda x, w: x + w]
    k = len(ws) // 2
    return eager_chain(x1, x2, fns * k, [(w,) for w in ws])


@pytest.mark.parametrize("loss", ["shared", "separate"])
def test_shared_and_passed_through_gradients_keep_eager_gradients(loss):
    """(y1 + y2) * u hands both halves the same gradient tensor; G = x + w passes its
    cotangent through as x's and w's gradient: a sum in place into either would change
    the other's value. fp64, against eager."""
    x1, x2, ws, texts = mixed_chain()
    u = torch.randn(16, 8, dtype=torch.double)

    def objective(y1, y2):
        if loss == "shared":
            return ((y1 + y2) * u).sum()
        return (y1 * u).square().sum() + (y2 * u).sum()

    inputs = [x1, x2] + ws
    for _ in range(2):  # the first call keeps every input (drift check); the second rebuilds
        got = torch.autograd.grad(objective(*run_mixed(x1, x2, ws, texts)), inputs)
    want = torch.autograd.grad(objective(*eager_mixed(x1, x2, ws)), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_retain_graph_keeps_what_a_second_backward_needs():
    x1, x2, ws, texts = mixed_chain()
    run_mixed(x1, x2, ws, texts)  # the drift check's call
    y1, y2 = run_mixed(x1, x2, ws, texts)
    loss = y1.square().sum() + y2.sum()
    inputs = [x1, x2] + ws
    first = torch.autograd.grad(loss, inputs, retain_graph=True)
    second = torch.autograd.grad(loss, inputs)
    want = torch.autograd.grad(
        (lambda a, b: a.square().sum() + b.sum())(*eager_mixed(x1, x2, ws)), inputs
    )
    for a, b, c in zip(first, second, want):
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(b, c, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(loss, inputs)


def test_an_output_modified_in_place_is_a_clear_error():
    """As autograd refuses a saved tensor modified after forward (the outputs are kept
    outside autograd's saved tensors when no saved-tensor hooks are active; under hooks
    they are saved tensors, which autograd leaves to the hooks, as for any op)."""
    x1, x2, ws, texts = mixed_chain()
    run_mixed(x1, x2, ws, texts)
    y1, y2 = run_mixed(x1, x2, ws, texts)
    loss = y1.sum() + y2.sum()
    with torch.no_grad():
        y1.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_saved_tensor_hooks_see_the_outputs_and_gradients_hold():
    """Under saved-tensor hooks the chain's outputs are packed like any saved tensor
    (memslim.saved_bytes counts them; offloading hooks move them) and gradients are eager's."""
    x1, x2, ws, texts = mixed_chain()
    run_mixed(x1, x2, ws, texts)
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y1, y2 = run_mixed(x1, x2, ws, texts)
    ptrs = {t.untyped_storage().data_ptr() for t in packed}
    assert y1.untyped_storage().data_ptr() in ptrs and y2.untyped_storage().data_ptr() in ptrs
    inputs = [x1, x2] + ws
    got = torch.autograd.grad(y1.square().sum() + y2.sum(), inputs)
    want = torch.autograd.grad(
        (lambda a, b: a.square().sum() + b.sum())(*eager_mixed(x1, x2, ws)), inputs
    )
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_saved_bytes_still_count_the_outputs():
    """memslim.saved_bytes (saved-tensor hooks) sees what the chain keeps: its two outputs
    and the functions' weights (a plain function's weights are not parameters to it)."""
    x1, x2, ws = mlp_chain(2)
    got = memslim.saved_bytes(lambda a, b: call_mlp_chain(a, b, ws)[0], x1, x2)
    assert got == 2 * HALF + sum(w.nbytes for w in ws), got
