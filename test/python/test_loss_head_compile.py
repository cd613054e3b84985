"""The fuse-loss-head pass under torch.compile(backend="memslim") and memslim.compile.

What: a loss head (transformers' form: float cast, flattened tokens, ignore_index) through
the backend: loss and gradients as close to eager's as plain torch.compile's are (x2, or
1e-6), what autograd keeps at least the logits' size below plain torch.compile's, the
record; the model returning its logits too (still the model's; the op reads them, their
linear skips the unused logits' zero gradient), and the user's loss reading them; and
memslim.compile on a transformers GPT-2 from a config: the loss_type it sets joins the
logits and the loss in one graph (torch._dynamo.explain), and the head is rewritten there.
Why: torch.compile is where language models train; a graph break or a partitioner that
saves the logits again would undo the pass silently.
"""

import pytest
import torch
import torch.nn.functional as F

import memslim

VOCAB, D = 3000, 32


class Head(torch.nn.Module):
    def __init__(self, return_logits=False):
        super().__init__()
        self.body = torch.nn.Linear(D, D)
        self.lm = torch.nn.Linear(D, VOCAB, bias=False)
        self.return_logits = return_logits

    def forward(self, x, t):
        logits = self.lm(torch.tanh(self.body(x)))
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), t.view(-1), ignore_index=-100)
        return (loss, logits) if self.return_logits else loss


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, D, generator=g)
    t = torch.randint(0, VOCAB, (2, 64), generator=g)
    t[1, -9:] = -100
    return x, t


def _run(f, model, x, t):
    model.zero_grad(set_to_none=True)
    out = f(x, t)
    (out[0] if isinstance(out, tuple) else out).backward()
    return out, {k: p.grad.clone() for k, p in model.named_parameters()}


def _ways(f, model, x, t, backends=("inductor", "memslim")):
    """f compiled with each backend ({backend: compiled}), each run once ({backend:
    (out, grads)}), and the fuse-loss-head records those compiles added."""
    ways = {}
    for backend in backends:
        torch._dynamo.reset()
        ways[backend] = torch.compile(f, backend=backend)
    n_before = len(memslim.compiled_decisions())
    results = {k: _run(c, model, x, t) for k, c in ways.items()}
    records = [
        str(d) for d in memslim.compiled_decisions()[n_before:] if "fuse-loss-head" in str(d)
    ]
    return ways, results, records


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("return_logits", [False, True])
def test_backend_takes_the_head(return_logits):
    x, t = _inputs()
    torch.manual_seed(0)
    model = Head(return_logits)
    want_out, want = _run(model, model, x, t)
    ways, results, records = _ways(model, model, x, t)
    assert records and "rewrote aten::cross_entropy_loss" in records[0], records
    for k in want:
        drift = _rel(results["inductor"][1][k], want[k])
        assert _rel(results["memslim"][1][k], want[k]) <= max(2 * drift, 1e-6), k
    if return_logits:
        torch.testing.assert_close(results["memslim"][0][1], want_out[1], rtol=1e-6, atol=1e-6)
        assert "form: reads the logits it returns to" in records[0], records
    kept = {
        k: memslim.saved_bytes(lambda a, b, f=f: f(a, b)[0] if return_logits else f(a, b), x, t)
        for k, f in ways.items()
    }
    logits = 2 * 64 * VOCAB * 4
    assert kept["memslim"] <= kept["inductor"] - logits + (128 * D + VOCAB * D) * 4 + 128 * D * 4


def test_backend_user_loss_reads_the_returned_logits():
    """The user's loss also reads the logits the graph returns: their gradient is
    nonzero, and memslim::linear's backward adds it (the loss op gives them none)."""
    x, t = _inputs()
    torch.manual_seed(0)
    model = Head(return_logits=True)

    def step(x, t):
        loss, logits = model(x, t)
        return loss, logits

    def run(f):
        model.zero_grad(set_to_none=True)
        loss, logits = f(x, t)
        (loss + logits.square().mean() * 0.1).backward()
        return {k: p.grad.clone() for k, p in model.named_parameters()}

    want = run(step)
    got = {}
    for backend in ("inductor", "memslim"):
        torch._dynamo.reset()
        got[backend] = run(torch.compile(step, backend=backend))
    for k in want:
        drift = _rel(got["inductor"][k], want[k])
        assert _rel(got["memslim"][k], want[k]) <= max(2 * drift, 1e-6), k


def test_memslim_compile_joins_transformers_loss_graph():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        vocab_size=512, n_embd=32, n_layer=1, n_head=2, n_positions=32, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 512, (2, 32))
    assert model.loss_type is None
    explain = torch._dynamo.explain(model)(input_ids=ids, labels=ids)
    assert explain.graph_count == 2  # the break memslim.compile removes
    torch._dynamo.reset()
    want = model(input_ids=ids, labels=ids).loss
    compiled = memslim.compile(model)
    got = compiled(input_ids=ids, labels=ids).loss
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    records = [str(d) for d in memslim.report(compiled) if "fuse-loss-head" in str(d)]
    assert any("set loss_type" in r for r in records), records
    assert any("rewrote aten::cross_entropy_loss" in r for r in records), records
    torch._dynamo.reset()
    assert torch._dynamo.explain(model)(input_ids=ids, labels=ids).graph_count == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_in_a_disabled_or_fp32_autocast_region_is_taken(dtype):
    """A float32 head inside `torch.autocast(..., enabled=False)` (or an enabled
    region in bf16 with the head under a nested disabled one) is float32: the pass
    takes it (the autocast marker's constants reach the core)."""
    x, t = _inputs()
    torch.manual_seed(0)
    model = Head()

    def step(x, t):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype == torch.bfloat16):
            with torch.autocast("cpu", enabled=False):
                return model(x, t)

    _, _, records = _ways(step, model, x, t, backends=("memslim",))
    assert records and "rewrote aten::cross_entropy_loss" in records[0], records


def test_bf16_autocast_head_left_to_inductor():
    """Under bf16 autocast the head's logits come from a 16-bit matmul: the pass keeps
    it, saying why (the op's float32 weight-gradient accumulation peaked where
    Inductor's step does, at 1.6x its time), and the step is Inductor's."""
    x, t = _inputs()
    torch.manual_seed(0)
    model = Head()

    def step(x, t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x, t)

    _, results, records = _ways(step, model, x, t)
    assert records and all("kept" in r and "16-bit matmul" in r for r in records), records
    torch.testing.assert_close(results["memslim"][0], results["inductor"][0])
    for k in results["inductor"][1]:
        torch.testing.assert_close(results["memslim"][1][k], results["inductor"][1][k])
