"""The probe behind `python -m memslim` (python/memslim/probe.py, __main__.py): its table's
measurements on a small model, its gradient verdict (a way that changes a gradient is
flagged, eager's own rounding is not), and bad input as one line and exit 1."""

import os
import sys
import textwrap

import pytest
import torch

import memslim  # noqa: F401
from memslim import __main__ as cli
from memslim import probe


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


def _batches():
    torch.manual_seed(0)
    return [((torch.randn(16, 32),), torch.randint(0, 8, (16,)))]


def test_probe_measures_each_way_and_gradients_agree():
    ways = probe.default_ways(compile=False)
    rows = probe.probe(
        Small,
        _batches(),
        torch.nn.functional.cross_entropy,
        ways,
        steps=2,
        rounds=2,
        progress=lambda m: None,
    )
    assert [r.way for r in rows] == [w.name for w in ways]
    for r in rows:
        assert r.error is None, r.error
        assert r.saved > 0 and r.peak > 0 and r.ratio > 0
        assert not probe.beyond_rounding(r), (r.way, r.grad_diff, r.grad_excess)
    eager, script = rows[0], rows[1]
    assert eager.grad_diff == 0.0
    # memslim.optimize rewrites the GELU after the norm: it keeps less than eager.
    rewrote = [d for d in script.records if d.verdict == "rewrote"]
    assert rewrote and script.saved < eager.saved, (script.records, script.saved)
    text = probe.render("small", rows)
    assert "TorchScript: memslim.optimize" in text and "MiB" in text


def test_a_way_that_changes_a_gradient_is_flagged():
    def wrong(model, args):
        with torch.no_grad():
            model.fc2.weight.mul_(1.001)  # a 0.1% change: far beyond fp32 rounding
        return model, None

    ways = [probe.Way("eager", probe._eager), probe.Way("wrong", wrong)]
    rows = probe.probe(
        Small,
        _batches(),
        torch.nn.functional.cross_entropy,
        ways,
        steps=1,
        rounds=1,
        progress=lambda m: None,
    )
    assert probe.beyond_rounding(rows[1]), (rows[1].grad_diff, rows[1].grad_excess)
    assert cli._verdict(rows) == 1


def test_a_failing_way_is_a_row_not_a_crash():
    def broken(model, args):
        raise RuntimeError("cannot build")

    rows = probe.probe(
        Small,
        _batches(),
        torch.nn.functional.cross_entropy,
        [probe.Way("eager", probe._eager), probe.Way("broken", broken)],
        steps=1,
        rounds=1,
        progress=lambda m: None,
    )
    assert rows[1].error == "RuntimeError: cannot build"
    assert "failed: RuntimeError: cannot build" in probe.render("t", rows)


@pytest.mark.parametrize(
    "text,want",
    [
        ("8x3x224x224", ((8, 3, 224, 224), "float")),
        ("2x128:int", ((2, 128), "int")),
        ("5", ((5,), "float")),
    ],
)
def test_parse_input(text, want):
    assert cli.parse_input(text) == want


def _run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["no_such_module_xyz:make", "--input", "2x3"], "cannot import 'no_such_module_xyz'"),
        (["probe_factories:missing", "--input", "2x3"], "has no 'missing'"),
        (
            ["probe_factories:raises", "--input", "2x3"],
            "probe_factories:raises() raised ValueError",
        ),
        (["probe_factories:not_a_module", "--input", "2x3"], "returned int, not an nn.Module"),
        (["probe_factories:small", "--input", "2by3"], "--input '2by3': expected sizes"),
        (["probe_factories:small"], "give the model's input sizes with --input"),
        (["probe_factories", "--input", "2x3"], "expected MODULE:FACTORY"),
        (["probe_factories:small", "--input", "2x3", "--steps", "0"], "at least 1"),
        (["probe_factories:small", "--input", "2x3", "--memory-budget", "-1"], "must be > 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(argv, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "probe_factories.py").write_text(
        textwrap.dedent("""
        import torch
        def small():
            return torch.nn.Linear(3, 2)
        def raises():
            raise ValueError("no config")
        def not_a_module():
            return 3
    """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("probe_factories", None)
    code, out, err = _run(argv, capsys)
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("memslim: error: "), err
    assert message in lines[0], lines[0]


def test_probe_of_a_user_factory_prints_the_table(tmp_path, monkeypatch, capsys):
    (tmp_path / "userfactory.py").write_text(
        textwrap.dedent("""
        import torch
        def mlp():
            return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                       torch.nn.Linear(32, 4))
    """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code, out, err = _run(
        ["userfactory:mlp", "--input", "8x16", "--no-compile", "--rounds", "1"], capsys
    )
    assert code == 0, err
    assert "userfactory:mlp (fp32)" in out and "torch.export: memslim.fx.optimize" in out
    assert "rewritten" in out  # the per-pass summary line
    assert os.getcwd() == str(tmp_path)


def test_bf16_autocast_probe_judges_every_way_against_float64(tmp_path, monkeypatch, capsys):
    (tmp_path / "userfactory16.py").write_text(
        textwrap.dedent("""
        import torch
        def mlp():
            return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
                                       torch.nn.SiLU(), torch.nn.Linear(32, 4))
    """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code, out, err = _run(
        [
            "userfactory16:mlp",
            "--input",
            "8x16",
            "--dtype",
            "bf16",
            "--no-compile",
            "--rounds",
            "1",
        ],
        capsys,
    )
    assert "userfactory16:mlp (bf16)" in out
    # Every way runs and is judged against float64: the export way fuses silu into the
    # linear (memslim::act_linear), whose backward failed outside autocast until the op
    # got its Autocast kernel (it exited 1 with "expected m1 and m2" then).
    for way in ("TorchScript: memslim.optimize", "torch.export: memslim.fx.optimize"):
        row = next(line for line in out.splitlines() if way in line)
        assert "(!)" not in row and "failed" not in row, row
    assert code == 0, err
