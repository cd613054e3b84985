"""memslim.report / memslim.summary for the ways in that need no torch.compile: a
ScriptModule from memslim.optimize, an exported program after memslim.fx.optimize, and
the one error for an object memslim never saw (naming the four ways in). The compiled
ways are test_reports_compile.py's (label `slow`)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memslim
import memslim.fx


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 16)

    def forward(self, x):
        return self.b(F.silu(self.a(x))) + F.gelu(x)


def _check_summary(obj, records):
    text = memslim.summary(obj)
    lines = text.splitlines()
    assert lines[0].startswith("memslim summary: ")
    assert max(len(line) for line in lines) <= 100, text
    for s in records.statistics():
        if s["sites"]:
            assert any(line.split()[:1] == [s["pass"]] for line in lines), (s["pass"], text)
    assert repr(text) == str(text)  # a REPL shows the text
    return text


def test_report_and_summary_of_a_script_module():
    opt = memslim.optimize(Block(), (torch.randn(8, 16),))
    records = memslim.report(opt)
    assert records and any(d.verdict == "rewrote" for d in records)
    assert [name for name, _ in records.graphs] == ["memslim.optimize (TorchScript)"]
    assert records.graphs[0][1] == records
    for s in records.statistics():
        assert s["bytes_before"] - s["bytes_after"] == s["bytes_freed"]
    text = _check_summary(opt, records)
    assert "through memslim.optimize (TorchScript): 1 graph(s)" in text


def test_report_and_summary_of_an_exported_program():
    model = Block()
    ep = memslim.fx.optimize(torch.export.export(model, (torch.randn(8, 16),)))
    records = memslim.report(ep)
    assert records and memslim.fx.report(ep) == records
    assert len(records.graphs) == 1
    rewritten = [s for s in records.statistics() if s["rewritten"]]
    assert rewritten and all(s["bytes_before"] > s["bytes_after"] for s in rewritten)
    text = _check_summary(ep, records)
    assert " -> " in text  # the rewritten sites' bytes before -> after


@pytest.mark.parametrize(
    "thing", [object(), nn.Linear(2, 2), torch.jit.script(nn.Linear(2, 2)), lambda x: x]
)
def test_an_object_memslim_never_saw_is_one_clear_error(thing):
    for fn in (memslim.report, memslim.summary):
        with pytest.raises(ValueError) as e:
            fn(thing)
        message = str(e.value)
        assert "\n" not in message
        assert f"memslim never saw this {type(thing).__name__}" in message
        for way in (
            'backend="memslim"',
            "memslim.compile(",
            "memslim.fx.optimize(",
            "memslim.optimize(",
        ):
            assert way in message, message
