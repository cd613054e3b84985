"""memslim.report / memslim.summary for what torch.compile made (label `slow`: each test
compiles): a module compiled with backend="memslim" (and the module it wraps), a compiled
function, memslim.compile's result, two compiled models in one process (each its own
graphs; a second model of the same class is served the first one's graphs by Dynamo's
cache and lists them as shared), a graph break and a recompile (each graph listed), DDP's
buckets, a model of blocks compiled one by one, a graph memslim failed on (listed with
why), a model compiled with another backend (the error names it), and the docs' examples
run as they are written (README's quick start, reference.md's torch.compile)."""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memslim

ROOT = Path(__file__).resolve().parents[2]


class Tanh(nn.Module):
    """GPT-2's hand-written GELU before a linear: the backend rewrites it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 16)

    def forward(self, x):
        h = self.a(x)
        return self.b(0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h))))


class Silu(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 16)

    def forward(self, x):
        return self.b(F.silu(self.a(x)))


class Broken(nn.Module):
    """Two graphs: Dynamo breaks the graph between the halves."""

    def __init__(self):
        super().__init__()
        self.a = Tanh()
        self.b = Silu()

    def forward(self, x):
        h = self.a(x)
        torch._dynamo.graph_break()
        return self.b(h)


def _step(model, batch=8):
    model(torch.randn(batch, 16, requires_grad=True)).square().sum().backward()


def _names(obj):
    return [name for name, _ in memslim.report(obj).graphs]


def _summary_lists(obj, names):
    text = memslim.summary(obj)
    for name in names:
        assert name[:60] in text, (name, text)
    return text


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_module_compiled_with_the_backend_has_its_report():
    model = Tanh()
    compiled = torch.compile(model, backend="memslim")
    assert memslim.report(compiled) == [] and memslim.report(compiled).graphs == []
    assert "no graph compiled yet" in memslim.summary(compiled)
    before = len(memslim.compiled_decisions())
    _step(compiled)
    records = memslim.report(compiled)
    assert any(d.verdict == "rewrote" for d in records), records
    assert memslim.compiled_decisions()[before:] == records
    assert memslim.report(model) == records  # the module the user kept
    [name] = _names(compiled)
    assert re.match(r"graph \d+/0: forward at test_reports_compile.py:\d+$", name), name
    text = _summary_lists(compiled, [name])
    assert "canonicalize-activations" in text and "inductor-partition" in text


def test_memslim_compile_and_a_compiled_function_have_their_reports():
    model = Silu()
    compiled = memslim.compile(model, max_added_work=4.0)
    _step(compiled)
    assert memslim.report(compiled) and memslim.report(model) == memslim.report(compiled)
    assert memslim.report(compiled).source == "memslim.compile"
    _summary_lists(compiled, _names(compiled))

    def fn(x):
        return F.silu(x) * x

    cfn = torch.compile(fn, backend="memslim")
    cfn(torch.randn(64, requires_grad=True)).sum().backward()
    assert memslim.report(cfn) and memslim.report(cfn) == memslim.report(fn)
    assert re.match(r"graph \d+/0: fn at ", _names(cfn)[0])


def test_two_compiled_models_keep_their_own_graphs():
    one, two = torch.compile(Tanh(), backend="memslim"), torch.compile(Silu(), backend="memslim")
    _step(one)
    _step(two)
    _step(one)
    mine = {id(d) for d in memslim.report(one)}
    assert len(_names(one)) == len(_names(two)) == 1
    assert not mine & {id(d) for d in memslim.report(two)}
    assert any(d.pass_ == "canonicalize-activations" for d in memslim.report(one))
    assert not any(d.pass_ == "canonicalize-activations" for d in memslim.report(two))
    # A second Tanh: Dynamo's cache (per code object and backend) serves one's graph.
    again = torch.compile(Tanh(), backend="memslim")
    _step(again)
    [shared] = _names(again)
    assert shared == _names(one)[0] + " (shared: compiled for another object)"
    assert {id(d) for d in memslim.report(again)} == mine


def test_a_graph_break_and_a_recompile_list_each_graph():
    model = torch.compile(Broken(), backend="memslim")
    _step(model)
    first, second = _names(model)
    assert re.match(
        r"graph (\d+)/0: forward at .* \(to a graph break at test_reports_compile", first
    )
    assert re.match(r"graph \d+/0: torch_dynamo_resume_in_forward_at_\d+ at ", second)
    assert all(records for _, records in memslim.report(model).graphs)
    _step(model, batch=5)  # a new batch size: each frame recompiled (dynamic)
    names = _names(model)
    assert len(names) == 4 and all("/1: " in n for n in names[2:]), names
    text = _summary_lists(model, names)
    assert text.startswith("memslim summary: OptimizedModule through torch.compile")
    assert text.splitlines()[0].endswith(": 4 graph(s)")
    assert max(len(line) for line in text.splitlines()) <= 100, text


def test_a_model_of_blocks_compiled_one_by_one_reports_each_block():
    # Per-block compiles (FSDP2's and torchtitan's pattern), and a block optimized by
    # memslim.optimize put into a model: the model's report lists every block's graphs.
    model = nn.Sequential(Tanh(), Silu(), Silu())
    model[0] = torch.compile(model[0], backend="memslim")
    model[1].compile(backend="memslim")
    model[2] = memslim.optimize(model[2], (torch.randn(8, 16),))
    _step(model)
    names = _names(model)
    assert len(names) == 3, names
    assert names[0].startswith("0: graph ") and names[1].startswith("1: graph ")
    assert names[2] == "2: memslim.optimize (TorchScript)"
    assert memslim.report(model[0]) and memslim.report(model[1])
    assert len(memslim.report(model)) == sum(len(memslim.report(b)) for b in model)
    _summary_lists(model, names)


def test_ddp_buckets_are_graphs_of_the_compiled_model(tmp_path):
    # torch.compile(DDP(model)): Dynamo's DDP optimizer hands the backend one graph per
    # gradient bucket under one compile id; DDP(torch.compile(model)) of a second model
    # of the class runs them from Dynamo's cache (listed as shared, under DDP's "module").
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(16, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 16)

        def forward(self, x):
            return self.c(F.silu(self.b(F.gelu(self.a(x)))))

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        outer = torch.compile(DDP(Wide(), bucket_cap_mb=1), backend="memslim")
        _step(outer)
        names = _names(outer)
        assert len(names) == 2 and all("(a DDP bucket)" in n for n in names), names
        assert names[1].endswith("(a DDP bucket), part 2")
        inner = DDP(torch.compile(Wide(), backend="memslim"), bucket_cap_mb=1)
        _step(inner)
        assert _names(inner) == [
            f"module: {n} (shared: compiled for another object)" for n in names
        ]
    finally:
        dist.destroy_process_group()


def test_a_graph_memslim_failed_on_is_listed_with_why(monkeypatch):
    import memslim.backend

    def fail(*a, **k):
        raise RuntimeError("no trace today")

    monkeypatch.delenv("MEMSLIM_STRICT", raising=False)
    monkeypatch.setattr(memslim.backend, "_aten_graph", fail)
    compiled = torch.compile(Silu(), backend="memslim")
    with pytest.warns(UserWarning, match="no trace today"):
        _step(compiled)
    [(name, records)] = memslim.report(compiled).graphs
    [d] = records
    assert d.pass_ == "memslim-backend" and d.verdict == "note"
    assert d.text == "graph compiled by Inductor unchanged: RuntimeError: no trace today"
    assert "(none applied: graph left to Inductor)" in memslim.summary(compiled)


def test_another_backend_is_named_in_the_error():
    compiled = torch.compile(Silu())  # Inductor
    with pytest.raises(ValueError, match=r"backend 'inductor', not 'memslim'.*four ways in"):
        memslim.report(compiled)


def _python_block(path: Path, after: str) -> str:
    """The first ```python block of `path` after the line containing `after`."""
    text = path.read_text()
    start = text.index("```python\n", text.index(after)) + len("```python\n")
    return text[start : text.index("```", start)]


@pytest.mark.parametrize(
    "path, after", [("README.md", "## Quick start"), ("docs/reference.md", "### torch.compile")]
)
def test_the_docs_examples_run_as_written_and_print_records(path, after):
    code = _python_block(ROOT / path, after)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, path, "exec"), {"__name__": "__main__"})
    assert "remark: " in out.getvalue(), out.getvalue()
