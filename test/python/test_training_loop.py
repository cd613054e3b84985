"""A plain training loop through torch.compile(backend="memslim") (issue 46's stack (c),
label `slow`): gradient accumulation, model.eval() / model.train() switches and
torch.no_grad() evaluation between steps. Recompilations are counted (the graphs
memslim.report lists for the model, and Dynamo's own count of the graphs it compiled): the
train and eval graphs are compiled once each, not at every switch. The losses equal
torch.compile(backend="inductor")'s within what Inductor's own run drifts from eager.
Models: a small net, GPT-2 and Llama from transformers' configs (CPU, fp32)."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memslim


class Net(nn.Module):
    """BatchNorm (running stats written in training, read in eval), a zero-rate dropout
    (training flag read, nothing drawn), GELU and SiLU that memslim rewrites, a LayerNorm."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 128)
        self.bn = nn.BatchNorm1d(128)
        self.drop = nn.Dropout(0.0)
        self.b = nn.Linear(128, 128)
        self.ln = nn.LayerNorm(128)
        self.c = nn.Linear(128, 10)

    def forward(self, x):
        h = self.drop(F.gelu(self.bn(self.a(x))))
        return self.c(F.silu(self.ln(self.b(h))))


def _gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _llama():
    """Llama from a config: RMSNorm, a SiLU-gated MLP, grouped-query attention; its loss
    type set, so that logits and loss are one graph (fuse-loss-head's, docs/facts.md)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"
    return model


def _data(kind, steps, accumulate):
    g = torch.Generator().manual_seed(1)
    n = steps * accumulate + 1
    if kind == "net":
        return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
                for _ in range(n)]  # fmt: skip
    return [(torch.randint(0, 64, (4, 16), generator=g),) * 2 for _ in range(n)]


def _loss(kind, model, x, y):
    if kind == "net":
        return F.cross_entropy(model(x), y)
    return model(input_ids=x, labels=y).loss


def _step(kind, model, run, opt, data, step, accumulate):
    """One optimizer step of `accumulate` micro-batches, then an evaluation under no_grad
    in eval mode; returns (train loss, eval loss)."""
    model.train()
    total = 0.0
    for i in range(accumulate):
        x, y = data[step * accumulate + i]
        loss = _loss(kind, run, x, y) / accumulate
        loss.backward()
        total += loss.item()
    opt.step()
    opt.zero_grad()
    model.eval()
    with torch.no_grad():
        held_out = _loss(kind, run, *data[-1]).item()
    model.train()
    return total, held_out


@pytest.mark.parametrize("kind", ["net", "gpt2", "llama"])
def test_train_eval_switches_compile_once_and_train_like_inductor(kind):
    steps, accumulate = 5, 2
    torch.manual_seed(0)
    model = {"net": Net, "gpt2": _gpt2, "llama": _llama}[kind]()
    models = {way: copy.deepcopy(model) for way in ("eager", "inductor", "memslim")}
    data = _data(kind, steps, accumulate)
    counters = torch._dynamo.utils.counters
    losses = {}
    for way, m in models.items():
        torch._dynamo.reset()
        counters.clear()
        run = m if way == "eager" else torch.compile(m, backend=way)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        per_step = []  # graphs Dynamo compiled so far, after each step
        losses[way] = []
        for step in range(steps):
            losses[way] += _step(kind, m, run, opt, data, step, accumulate)
            per_step.append(counters["stats"]["unique_graphs"])
        if way == "eager":
            continue
        # The first step compiles the train and the eval graphs; no later step compiles.
        assert per_step[0] >= 2 and per_step[1:] == [per_step[0]] * (steps - 1), per_step
        if way == "memslim":
            graphs = memslim.report(run).graphs
            assert len(graphs) == per_step[0], [name for name, _ in graphs]
            assert any(records for _, records in graphs)
            if kind == "net":  # the eval graph: rewrites decided, none applied (no grad)
                assert "(none applied: graph left to Inductor)" in memslim.summary(run)
    drift = max(abs(a - b) for a, b in zip(losses["inductor"], losses["eager"]))
    tol = max(4 * drift, 1e-5)
    off = max(abs(a - b) for a, b in zip(losses["memslim"], losses["inductor"]))
    print(f"{kind}: graphs {per_step}, memslim - inductor {off:.3g}, inductor - eager {drift:.3g}")
    for got, want in zip(losses["memslim"], losses["inductor"]):
        assert abs(got - want) <= tol, (losses, drift)
