"""The one activation table (kernels/include/memslim/kernels/activation_table.def),
checked against what it claims: every public op is registered with aten's argument
names, every kernel name and parameter count reaches the runtime, and the "aten
keeps" / "in-place keeps" columns the cost model prices from agree with what aten's
autograd saves (saved_tensors_hooks on torch itself)."""

import pytest
import torch

import memslim

TABLE = memslim.activation_table()
OPS = {o["name"]: o for o in TABLE["ops"]}
KERNELS = {k["name"]: k for k in TABLE["kernels"]}


def test_python_reads_the_table():
    assert memslim.OPS == tuple(OPS)
    assert {o["kernel"] for o in OPS.values()} <= set(KERNELS)
    # non-monotonic kernels carry their minimum, the others none
    for k in KERNELS.values():
        assert (k["x_min"] is not None) == (k["save"] == "OutputBitsExact"), k


@pytest.mark.parametrize("name", sorted(OPS))
def test_schema_has_atens_arguments(name):
    ours = getattr(torch.ops.memslim, name).default._schema
    aten = getattr(torch.ops.aten, name).default._schema
    assert [a.name for a in ours.arguments] == [a.name for a in aten.arguments]
    assert len(ours.returns) == 1


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_name_and_parameter_count_reach_the_runtime(name):
    """activation_dropout checks the table's parameter count and names, and refuses
    the Mask kernels (which is why the dropout fusion never proposes them)."""
    k = KERNELS[name]
    x = torch.randn(8)
    if k["save"] == "Mask":
        with pytest.raises(
            RuntimeError, match="keeps only a mask; it needs no fusion with dropout"
        ):
            torch.ops.memslim.activation_dropout(x, name, [0.5] * k["params"], 0.1, True)
        return
    with pytest.raises(
        RuntimeError, match=rf"takes {k['params']} parameters \({k['param_names']}\)"
    ):
        torch.ops.memslim.activation_dropout(x, name, [0.5] * (k["params"] + 1), 0.1, True)
    assert (
        torch.ops.memslim.activation_dropout(x, name, [0.5] * k["params"], 0.1, True).shape
        == x.shape
    )


def _storages(ts):
    return {t.untyped_storage().data_ptr() for t in ts}


def _saved(fn):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fn()
    return out, saved


@pytest.mark.parametrize("name", sorted(OPS))
def test_aten_keeps_column_is_what_aten_saves(name):
    x = torch.randn(64, requires_grad=True)
    y, saved = _saved(lambda: getattr(torch.ops.aten, name)(x))
    got = _storages(saved)
    kept = {"Input": x, "Output": y}[OPS[name]["aten_keeps"]]
    assert kept.untyped_storage().data_ptr() in got, (name, OPS[name]["aten_keeps"])


@pytest.mark.parametrize("name", sorted(OPS))
def test_inplace_keeps_column_is_what_aten_saves(name):
    if not hasattr(torch.ops.aten, name + "_"):
        pytest.skip(f"aten has no {name}_")
    x = torch.randn(64, requires_grad=True)
    h = x * 1.0
    before = h.detach().clone()
    out, saved = _saved(lambda: getattr(torch.ops.aten, name + "_")(h))
    outputs = [
        t for t in saved if t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
    ]
    copies = [t for t in saved if t.shape == before.shape and torch.equal(t.detach(), before)]
    want = OPS[name]["inplace_keeps"]
    assert (outputs, copies)[want == "Input"], (name, want, len(outputs), len(copies))
    assert not (outputs, copies)[want == "Output"], (name, want)
