"""The pass table as Python sees it: one list of passes, pipelines per front end, and the
per-pass statistics memslim.report(x).statistics() counts from the records."""

import pathlib

import pytest
import torch

import memslim
from memslim import _C

LIT = pathlib.Path(__file__).resolve().parents[2] / "lit-tests"


def test_every_pass_has_its_lit_file():
    for flag in _C.list_passes():
        if flag != "test-perturb-outputs":
            assert (LIT / f"{flag}.ir").is_file(), flag


def test_pipelines_per_front_end_come_from_one_table():
    ts = _C.pipeline_passes("memslim-default", "torchscript")
    fx = _C.pipeline_passes("memslim-default", "fx")
    compile_ = _C.pipeline_passes("memslim-default", "compile")
    assert fx == _C.fx_default_passes()
    assert [p for p in ts if p in fx] == fx  # same order, a subset
    assert set(ts) - set(fx) == {
        "remove-identity-dropouts",
        "fuse-rotate-half",
        "cleanup",
        "invertible-couplings",
    }
    assert [p for p in fx if p != "fuse-activation-dropout"] == compile_
    with pytest.raises(ValueError, match="unknown pipeline 'nope'"):
        _C.pipeline_passes("nope", "fx")
    with pytest.raises(ValueError, match="front_end must be"):
        _C.pipeline_passes("memslim-default", "onnx")


def test_statistics_count_the_records():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = memslim.optimize(m, (torch.randn(8, 16),))
    records = memslim.report(opt)
    stats = {s["pass"]: s for s in records.statistics()}
    for p in {d.pass_ for d in records}:
        mine = [d for d in records if d.pass_ == p]
        assert stats[p]["rewritten"] == sum(d.verdict == "rewrote" for d in mine)
        assert stats[p]["kept"] == sum(d.verdict == "kept" for d in mine)
        assert stats[p]["bytes_freed"] == sum(
            d.freed_bytes or 0 for d in mine if d.verdict == "rewrote"
        )
        assert sum(n for _, n in stats[p]["kept_by_reason"]) == stats[p]["kept"]
    assert "Pass statistics report" in records.stats_text()


def _one_op_graph(op: str, x_requires_grad: bool = True):
    """x -> y = <op>(x) -> y * y: the FX boundary built by hand, named fields only (the
    product keeps y, so an output-saving op frees x)."""
    g = _C.FxGraph()
    kw = dict(numel=4096, dtype=torch.float32, device="cpu", state=False, rank=2)
    x = g.add_tensor("x", requires_grad=x_requires_grad, contiguous=True, sizes=[64, 64], **kw)
    g.add_node("prim::Param", None, [], [x])
    approx = g.add_constant("'none'", "none")
    y = g.add_tensor("y", requires_grad=None, contiguous=True, sizes=[64, 64], **kw)
    g.add_node(op, "", [x, approx], [y])
    z = g.add_tensor("z", requires_grad=None, contiguous=True, sizes=[64, 64], **kw)
    g.add_node("aten::mul", "Tensor", [y, y], [z])
    g.add_node("prim::Return", None, [z], [])
    return g


def test_fx_boundary_is_typed_and_one_graph_serves_many_runs():
    g = _one_op_graph("aten::gelu")
    assert (g.num_values, g.num_nodes) == (4, 4)
    with pytest.raises(TypeError):  # the tensor facts are keywords, not positions
        g.add_tensor("z", 1, torch.float32, "cpu", None, False, 1, True, [1])
    policy = memslim._policy.check("test", {})
    runs = [_C.fx_run(g, ["output-saving-activations"], policy) for _ in range(2)]
    for run in runs:  # each run builds its own view: the second sees the graph unchanged
        assert [r["pass"] for r in run.records] == ["output-saving-activations"]
        assert run.ladder is None and run.pieces is None and run.chains == []
    assert [(r["verdict"], r["site"]) for r in runs[0].records] == [
        (r["verdict"], r["site"]) for r in runs[1].records
    ]
    for run in runs:
        assert run.records[0]["verdict"] == "rewrote", run.records[0]["line"]
        (rw,) = run.rewrites  # named fields, no positions
        assert (rw.node, rw.kind, rw.overload, rw.args, rw.erased, rw.region) == (
            1,
            "memslim::gelu",
            "",
            None,
            [],
            None,
        )


def test_fx_boundary_refuses_an_unknown_op_with_a_value_error():
    g = _one_op_graph("aten::no_such_op")
    with pytest.raises(ValueError, match="no_such_op"):
        _C.fx_run(g, None, memslim._policy.check("test", {}))
