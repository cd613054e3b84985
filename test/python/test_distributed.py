"""Data-parallel training stacks through memslim (issue 46; label `slow`: two processes
compile a model twice each).

What: two ranks on gloo (CPU, fp32; torch.multiprocessing spawn, a free port) train a
small GPT-2 built from transformers' GPT2Config for three AdamW steps, first with plain
Inductor, then with memslim, in the same processes and on the same data:
- DDP(torch.compile(model, backend="memslim")) against DDP(torch.compile(model,
  backend="inductor"));
- FSDP2 (`fully_shard` on each block and the root) + memslim.compile(model,
  memory_budget=0.5) against the same FSDP2 model + torch.compile(backend="inductor").
Each asserts: finite losses, no graph compiled after the first step, every loss and
every parameter's step-1 gradient (the full tensor, FSDP2's shards gathered) equal to
plain Inductor's within 1e-5 (measured 2026-11-29: DDP's losses within 4.8e-7 and
gradients within 3.7e-8, FSDP2's bit for bit), memslim's records present for the compiled
graphs (FSDP2's: each graph's memory budget met), and no graph "compiled by Inductor
unchanged" (MEMSLIM_STRICT=1 raises instead). The frames Dynamo gives up on are listed:
none under DDP; under FSDP2 the frames whose calls of FSDP2's disabled hooks Dynamo cannot
resume from (transformers' forward wrapper, GPT-2's loop over blocks: torch's; FSDP2 runs
without strict mode).
Why: DDP hands the backend a graph per gradient bucket and FSDP2 puts its parameter
hooks around each block; memslim must compile what they give it and keep their gradients
right."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("transformers")

STEPS = 3
TOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpt2():
    import transformers

    config = transformers.GPT2Config(
        vocab_size=512, n_positions=32, n_embd=64, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # one graph for logits and loss (docs/facts.md)
    return model


def _wrap(style, way, model):
    """The model as `style` trains it, compiled `way`."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    import memslim

    if style == "ddp":
        return DDP(torch.compile(model, backend=way))
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    if way == "memslim":
        return memslim.compile(model, memory_budget=0.5)
    return torch.compile(model, backend=way)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _train(style, way, rank):
    """Three steps on this rank's batches: (losses, step-1 gradients by name, memslim's
    graph names and record counts)."""
    import memslim

    torch._dynamo.reset()
    model = _gpt2()
    run = _wrap(style, way, model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + rank)
    losses, grads, per_step = [], {}, []
    counters = torch._dynamo.utils.counters
    counters.clear()
    for step in range(STEPS):
        x = torch.randint(0, 512, (2, 32), generator=g)
        loss = run(input_ids=x, labels=x).loss
        loss.backward()
        if step == 0:
            grads = {n: _full(p.grad).detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        per_step.append(counters["stats"]["unique_graphs"])
    # Step 1 compiles every graph (FSDP2: one per block, its hooks break the graph); no
    # later step compiles.
    assert per_step[0] >= 1 and per_step[1:] == [per_step[0]] * (STEPS - 1), (way, per_step)
    graphs = []
    if way == "memslim":
        graphs = [(name, [str(d) for d in recs]) for name, recs in memslim.report(run).graphs]
        graphs.append(("fallbacks", [d.text for d in memslim.report(run).fallbacks()]))
    return losses, grads, graphs


def _worker(rank, world, port, style, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if style == "fsdp2":
        # FSDP2's hooks (torch._dynamo.disable(), _fsdp_common.py) break the graph where
        # Dynamo cannot resume: in transformers' forward wrapper (generic.py) and in the loop
        # over GPT-2's blocks ("graph break in loop"): it gives up on those frames (plain
        # Inductor alike) and compiles the frames they call (each block, the loss head).
        # Strict mode raises on such a frame (memslim/fallbacks.py); the test checks that
        # they are reported.
        os.environ.pop("MEMSLIM_STRICT", None)
    try:
        result = {way: _train(style, way, rank) for way in ("inductor", "memslim")}
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("style", ["ddp", "fsdp2"])
def test_two_ranks_train_like_inductor(style, tmp_path):
    out = tmp_path / "result.pt"
    mp.spawn(_worker, args=(2, _free_port(), style, str(out)), nprocs=2, join=True)
    result = torch.load(out)
    (ind_losses, ind_grads, _), (ms_losses, ms_grads, graphs) = (
        result["inductor"],
        result["memslim"],
    )
    assert all(torch.isfinite(torch.tensor(ms_losses))), ms_losses
    for got, want in zip(ms_losses, ind_losses):
        assert abs(got - want) <= TOL, (ms_losses, ind_losses)
    assert ms_grads.keys() == ind_grads.keys() and ms_grads
    worst = max(((ms_grads[n] - ind_grads[n]).abs().max().item(), n) for n in ind_grads)
    dloss = max(abs(a - b) for a, b in zip(ms_losses, ind_losses))
    print(f"{style}: losses {ms_losses}, |loss - inductor's| <= {dloss:.3g}, gradients {worst}")
    assert worst[0] <= TOL, worst
    fallbacks = dict(graphs).pop("fallbacks")
    graphs = [(n, recs) for n, recs in graphs if n != "fallbacks"]
    assert graphs and any(recs for _, recs in graphs), graphs
    if style == "ddp":
        assert fallbacks == [], fallbacks
    else:  # torch's: FSDP2's disabled hooks in a frame Dynamo cannot resume (above)
        # (and a dict comprehension of transformers' output capturing that the eager wrapper
        # calls: "C-implemented special method without VariableTracker model")
        assert all(t.startswith("Dynamo gave up on") for t in fallbacks), fallbacks
        assert any("graph break in loop (at _fsdp_common.py:" in t for t in fallbacks), "\n".join(
            fallbacks
        )
    text = "\n".join(r for _, recs in graphs for r in recs)
    assert "compiled by Inductor unchanged" not in text, text
    if style == "fsdp2":  # memslim.compile's target, the model's: each graph meets its share
        records = [r for _, recs in graphs for r in recs if "memory-budget:" in r]
        budgets = [r for r in records if "the model:" not in r]
        assert budgets and all(": met" in r for r in budgets), budgets
        model = [r for r in records if "the model:" in r]
        assert model and all(r.endswith(": met") for r in model), model
