"""The budget planner's dry runs share one joint graph per graph (budget.measure).

What: a ladder step's recompute tags put on a copy of the joint traced without them
(measure._retag, by the joint nodes' provenance) give the figures a trace with the tags
on gives, at every step of the pieces ladder, on a decoder (dropout, attention, a loss)
and a CNN (batch norm, ReLU, residual joins); and inside shared_joints() the graph is
traced once, whatever the steps measured.
Why: every probe of the planner's ladders is one of these dry runs; one that measured
something else than the compile partitions would mislead the planner silently.
"""

import pytest
import torch

import memslim  # noqa: F401  (loads the library)
from memslim import _models, backend, fx
from memslim.budget import measure
from memslim.budget.knapsack import FUSED_RECOMPUTE


def _decoder():
    torch.manual_seed(0)
    m = _models.tiny_decoder(dim=32, hidden=64, depth=1, seq=8)
    x = torch.randint(0, 2048, (2, 8))
    return m, (x, x)


def _cnn():
    torch.manual_seed(0)
    return _models.custom_act_resnet(classes=4, blocks=(1, 1, 0, 0)), (torch.randn(2, 3, 16, 16),)


def _ladder_steps(model, args):
    """Each step of the pieces ladder measured twice: traced with its tags on (outside
    shared_joints(), as before the joint was shared), and as a retagged copy of the one
    joint (inside). Returns ([(step, traced, shared)], traces inside)."""
    from torch._functorch import config as functorch_config

    out = {}

    def be(gm, example_inputs):
        aten, mode, fakes = backend._aten_graph(gm, example_inputs)
        skip = {i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)}
        serial = fx._Serializer(
            aten.graph,
            backend._leaf_grad(aten, example_inputs),
            backend._parameters(aten, example_inputs),
        )
        plain = fx._plan(
            aten, [], {"memory_budget": 0.5}, regions="tags", serial=serial, ladders="tags"
        )[3]
        n = len(plain.steps)
        light = max(k for k, step in enumerate(plain.steps) if step.light)
        steps = sorted({0, 1, light, n // 3, (2 * n) // 3, n - 1})  # (a trace each: ~1 s)
        rows, traces = [], []
        real = measure._split

        def counting(joint, *a):
            traces.append(a[2] not in (measure._JOINTS or {}))
            return real(joint, *a)

        with measure._dynamic_output_shapes(mode), functorch_config.patch(**FUSED_RECOMPUTE):
            for k in steps:
                plain.tag(k)
                rows.append([k, measure._partitioned_saved_bytes(aten, fakes, skip)])
            measure._split = counting
            try:
                with measure.shared_joints():
                    for row in [rows[0], *rows[:0:-1]]:  # any order
                        plain.tag(row[0])
                        row.append(measure._partitioned_saved_bytes(aten, fakes, skip))
            finally:
                measure._split = real
            plain.tag(0)
        out.update(rows=rows, traces=sum(traces))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=be)(*args)
    return out["rows"], out["traces"]


@pytest.mark.parametrize("make", [_decoder, _cnn], ids=["decoder", "cnn"])
def test_retagged_joint_measures_what_a_tagged_trace_does(make):
    rows, traces = _ladder_steps(*make())
    assert len(rows) >= 4, rows  # a ladder with steps to compare
    assert traces == 1, f"{traces} traces inside shared_joints(), expected one"
    assert len({r[1] for r in rows}) >= 2, rows  # the steps keep different bytes
    for k, traced, shared in rows:
        assert int(traced) == int(shared), (k, traced, shared)
        assert traced.profile() == shared.profile(), (k, traced.profile(), shared.profile())
