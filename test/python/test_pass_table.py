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
    assert set(ts) - set(fx) == {"remove-identity-dropouts", "cleanup", "invertible-couplings"}
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
