"""memslim.optimize's front door: example inputs of every kind TorchScript takes,
arguments with defaults, keyword example inputs, policy validation, and a recording
run that leaves no trace (module state, global RNG, stdout)."""

import re
from typing import Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F

import memslim


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)  # every test draws its inputs: the same ones on every run


def _close(want, got, tol=1e-5):
    """Relative L2, the project's measure: element-wise rtol fails on a gradient whose
    entries cancel (here `* pair[1].sum()` scales them to ~50 while fp32 reorders)."""
    return float((got - want).norm()) <= tol * max(float(want.norm()), 1e-30)


def _grads_match(m, opt, *args):
    torch.manual_seed(3)
    ref = m(*args)
    torch.manual_seed(3)
    out = opt(*args)
    assert _close(ref, out)
    params = [p for p in m.parameters()]
    g1 = torch.autograd.grad(ref.sum(), params)
    g2 = torch.autograd.grad(out.sum(), params)
    for a, b in zip(g1, g2):
        assert _close(a, b), float((b - a).norm() / a.norm())


class Flags(torch.nn.Module):
    """forward(x, flag: bool, k: int, s: float, name: str) as transformers models take."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 16)

    def forward(self, x, flag: bool, k: int, s: float, name: str):
        h = F.gelu(self.a(x))
        if flag:
            h = h * s
        if name == "twice":
            h = h + h
        return self.b(h) + k


def test_bool_int_float_str_example_inputs():
    m = Flags()
    x = torch.randn(4, 16)
    opt = memslim.optimize(m, (x, True, 2, 0.5, "twice"))
    assert any("rewrote aten::gelu" in r for r in memslim.report(opt)), memslim.report(opt)
    _grads_match(m, opt, x, True, 2, 0.5, "twice")


class Containers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)

    def forward(
        self,
        pair: Tuple[torch.Tensor, torch.Tensor],
        xs: List[torch.Tensor],
        d: Dict[str, torch.Tensor],
        bias: Optional[torch.Tensor],
    ):
        z = self.a(pair[0] + xs[0] + d["x"])
        if bias is not None:
            z = z + bias
        return self.a(F.gelu(z)) * pair[1].sum()


def test_containers_and_none_example_inputs():
    m = Containers()
    x = torch.randn(4, 16)
    args = ((x, torch.randn(4, 16)), [torch.randn(4, 16)], {"x": torch.randn(4, 16)}, None)
    opt = memslim.optimize(m, args)
    assert any("fused aten::gelu" in r for r in memslim.report(opt)), memslim.report(opt)
    _grads_match(m, opt, *args)


class WithDefaults(torch.nn.Module):
    """timm's ViT / DeiT / EVA: forward(x, attn_mask=None, is_causal=False)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 16)

    def forward(
        self,
        x,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
        scale: float = 1.0,
    ):
        h = self.b(F.gelu(self.a(x))) * scale  # b keeps gelu's output: b takes gelu in
        if attn_mask is not None:
            h = h + attn_mask
        if is_causal:
            h = h.tril()
        return h


def test_arguments_with_defaults_need_no_example_values():
    m = WithDefaults()
    x = torch.randn(4, 16)
    for example in [(x,), (x, None, False), (x, None, True, 2.0), x, {"x": x, "is_causal": True}]:
        opt = memslim.optimize(m, example)
        assert any("fused aten::gelu" in r for r in memslim.report(opt)), (
            example,
            memslim.report(opt),
        )
        _grads_match(m, opt, x)


def test_keyword_example_inputs():
    m = Flags()
    x = torch.randn(4, 16)
    opt = memslim.optimize(m, {"x": x, "flag": False, "k": 1, "s": 2.0, "name": "once"})
    assert any("rewrote aten::gelu" in r for r in memslim.report(opt))
    _grads_match(m, opt, x, False, 1, 2.0, "once")


def test_example_input_errors_are_clear():
    m = Flags()
    x = torch.randn(4, 16)
    with pytest.raises(TypeError, match=r"forward's argument 'flag' takes bool, got str"):
        memslim.optimize(m, (x, "yes", 1, 1.0, "a"))
    with pytest.raises(RuntimeError, match=r"no value for 'k' \(int, no default\)"):
        memslim.optimize(m, (x, True))
    with pytest.raises(RuntimeError, match=r"forward takes 5 inputs, got 6 example inputs"):
        memslim.optimize(m, (x, True, 1, 1.0, "a", x))
    with pytest.raises(TypeError, match=r"forward has no argument 'y'"):
        memslim.optimize(m, {"y": x})
    with pytest.raises(TypeError, match=r"example_inputs must be a tuple or list"):
        memslim.optimize(m, 3)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"min_bytes": -100}, r"min_bytes must be an integer in \[0, "),
        ({"min_bytes": 1.5}, r"min_bytes must be an integer"),
        ({"min_bytes": True}, r"min_bytes must be an integer"),
        ({"max_added_work": float("nan")}, r"max_added_work must be a number >= 0"),
        ({"max_added_work": -1}, r"max_added_work must be a number >= 0"),
        ({"max_added_work": "2"}, r"max_added_work must be a number >= 0"),
        ({"dropout_mask_bytes": 7}, r"dropout_mask_bytes must be 0 or 1, got"),
        ({"dropout_mask_bytes": 0.5}, r"dropout_mask_bytes must be 0 or 1, got"),
        ({"assume_numel": -5}, r"assume_numel must be an integer in \[0, 1099511627776\]"),
        ({"assume_numel": 2**41}, r"assume_numel must be an integer in \[0, 1099511627776\]"),
        ({"assume_numel": float("inf")}, r"assume_numel must be an integer"),
    ],
)
def test_policy_values_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        memslim.optimize(WithDefaults(), (torch.randn(2, 16),), **kw)


def test_policy_values_in_range_are_accepted():
    opt = memslim.optimize(
        WithDefaults(),
        (torch.randn(2, 16),),
        min_bytes=0,
        max_added_work=float("inf"),
        assume_numel=2**40,
        dropout_mask_bytes=0,
    )
    assert memslim.report(opt)
    opt = memslim.optimize(WithDefaults(), (torch.randn(2, 16),), min_bytes=1e3, max_added_work=2)
    assert memslim.report(opt)


def test_policy_is_one_table_for_both_front_ends():
    """memslim.optimize's policy keywords and memslim-opt's policy flags are the rows
    of passes/core/policy.cpp's table, and both refuse a value with the same expectation."""
    import inspect
    import subprocess
    from pathlib import Path

    from memslim import _C

    names = [n for n, _, _ in _C.policy_options()]
    params = inspect.signature(memslim.optimize).parameters
    assert names and all(n in params for n in names)
    opt_tool = Path(__file__).resolve().parents[2] / "build" / "bin" / "memslim-opt"
    if not opt_tool.exists():
        pytest.skip("memslim-opt not built")
    usage = subprocess.run([str(opt_tool), "--help"], capture_output=True, text=True).stdout
    for n in names:
        flag = "--" + n.replace("_", "-")
        assert flag + "=" in usage, flag
        r = subprocess.run(
            [str(opt_tool), "-", "--passes=cleanup", flag + "=-3"],
            input="graph():\n  return ()\n",
            capture_output=True,
            text=True,
        )
        assert r.returncode == 1, r.stderr
        expect = r.stderr.split("expected ", 1)[1].strip()
        with pytest.raises(ValueError, match=f"{n} must be " + re.escape(expect) + ", got -3"):
            memslim.optimize(WithDefaults(), (torch.randn(2, 16),), **{n: -3})


def test_policy_takes_numpy_numbers():
    np = pytest.importorskip("numpy")
    opt = memslim.optimize(
        WithDefaults(),
        (torch.randn(2, 16),),
        min_bytes=np.int64(0),
        max_added_work=np.float32(2.0),
        assume_numel=np.int32(0),
    )
    assert memslim.report(opt)


class Stateful(torch.nn.Module):
    """BatchNorm in train mode (running stats, num_batches_tracked), an attribute
    set in forward, dropout (draws from the global RNG) and a print."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16, bias=False)  # (a bias before BN has no gradient)
        self.bn = torch.nn.BatchNorm1d(16)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        print("forward called")
        h = F.dropout(F.gelu(self.bn(self.lin(x))), 0.5, self.training)
        return self.lin(h)


def test_recording_run_leaves_module_rng_and_stdout_alone(capfd):
    m = torch.jit.script(Stateful())
    before = {k: v.clone() for k, v in m.state_dict().items()}
    capfd.readouterr()
    torch.manual_seed(7)
    x = torch.randn(8, 16)
    rng = torch.get_rng_state()
    opt = memslim.optimize(m, (x,))
    assert torch.equal(torch.get_rng_state(), rng)
    out, _ = capfd.readouterr()
    assert "forward called" not in out
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    for k, v in opt.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert m.calls == 0 and opt.calls == 0
    assert any("aten::gelu" in r and "unknown shape" not in r for r in memslim.report(opt)), (
        memslim.report(opt)
    )


class VarArgs(torch.nn.Module):
    """forward(*xin), as memcnn's InvertibleModuleWrapper writes it: TorchScript cannot
    compile a variable number of arguments (NotSupportedError)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16, bias=False)  # (a bias before BN has no gradient)
        self.bn = torch.nn.BatchNorm1d(16)

    def forward(self, *xin):
        h = self.bn(self.lin(xin[0]))
        if len(xin) > 1:  # a Python branch: the trace keeps the one these inputs take
            h = h + xin[1]
        return F.gelu(h)


def test_unscriptable_module_falls_back_to_trace_with_a_note():
    m = VarArgs()
    x = torch.randn(8, 16)
    with pytest.raises(Exception, match="variable number of arguments"):
        torch.jit.script(m)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    rng = torch.get_rng_state()
    opt = memslim.optimize(m, (x,))
    # The trace's forward run left the module's state and the global RNG as they were.
    for k, v in m.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert torch.equal(torch.get_rng_state(), rng)
    notes = [d for d in memslim.report(opt) if d.verdict == "note" and "trace" in d.text]
    assert len(notes) == 1, list(memslim.report(opt))
    assert "NotSupportedError" in notes[0].text and "specialises control flow" in notes[0].text
    assert "memslim::batch_norm" in str(opt.graph)  # the passes ran on the trace
    _grads_match(m, opt, x.clone().requires_grad_())


def test_unscriptable_module_without_example_inputs_says_why():
    with pytest.raises(RuntimeError, match="example_inputs.*torch.jit.trace"):
        memslim.optimize(VarArgs())
