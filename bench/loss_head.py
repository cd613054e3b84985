"""The loss head without its logits, measured: fuse-loss-head against torch.compile.

What: (1) the head alone, cross_entropy(linear(h, W), t) at 1,024 tokens, d 512, vocab
32,000 and 128,256, fp32 and bf16 autocast, through torch.compile (Inductor) and
torch.compile(backend="memslim"): the step's peak (the profiler's live tensor bytes over
forward + backward, the weight's gradient included, allocated from a step start with no
gradients), step time (medians of interleaved runs, as a ratio to torch.compile's), loss
and gradients against eager's; (2) transformers' causal LMs from configs (GPT-2, Llama,
Qwen2; vocab 32,000, batch 2 x 512 tokens, fp32, dropout 0) through torch.compile and
memslim.compile, and through torch.export with and without memslim.fx.optimize: saved bytes
(saved_tensors_hooks), peak, step time, gradients against eager's; memslim.compile sets
the model's loss_type (memslim/_transformers.py) so the logits and the loss share a graph;
plain torch.compile runs the same model with it set too.
Writes a markdown table (stdout, or --out FILE) headed by the date and commit.
Why: the pass is judged by the step's peak and time, not by saved bytes alone.
Usage: python bench/loss_head.py [--quick] [--out FILE] [--part head|models|all]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import memslim
from memslim.probe import step_peak_bytes


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:
        return "unknown"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / (b.double().norm() + 1e-30))


def _interleaved(fns: dict, reps: int) -> dict:
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            s = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - s)
    return {k: statistics.median(v) for k, v in times.items()}


def head_rows(vocab: int, dtype: str, reps: int) -> list:
    n, d = 1024, 512
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(vocab, d) * 0.02)
    h0 = torch.randn(n, d)
    t = torch.randint(0, vocab, (n,))
    t[:17] = -100
    auto = dtype == "bf16"

    def head(h):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=auto):
            return F.cross_entropy(F.linear(h, w), t, ignore_index=-100)

    ways = {"eager": head}
    for backend in ("inductor", "memslim"):
        torch._dynamo.reset()
        ways[backend] = torch.compile(head, backend=backend)
    # The op by hand at other chunk sizes (rows per chunk; the pass leaves 0: the op
    # picks a chunk whose logits are 30% of the weight gradient's bytes): the peak /
    # time trade-off. In bf16 the pass leaves the head to Inductor: the op by hand
    # (its own chunk) shows why.
    sizes = {"op by hand, its chunk": 0} if auto else {f"op, chunk {c}": c for c in (256, 1024)}
    chunked = dict(sizes)
    for name, c in chunked.items():

        def by_hand(h, c=c):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=auto):
                return torch.ops.memslim.linear_cross_entropy(h, w, None, t, 1, -100, 0.0, None, c)

        ways[name] = by_hand
    names = ["inductor", "memslim", *chunked]

    def step(f):
        def run():
            h = h0.clone().requires_grad_()
            f(h).backward()
            return h

        return run

    def fresh(f):  # a step from no gradients (the weight's gradient allocated in it)
        def run():
            w.grad = None
            return step(f)()

        return run

    ref_h = fresh(head)()
    ref = (ref_h.grad.clone(), w.grad.clone())
    rows = []
    for k in names:
        h = fresh(ways[k])()  # compiles
        h = fresh(ways[k])()
        err = max(_rel(h.grad, ref[0]), _rel(w.grad, ref[1]))
        w.grad = None
        peak = step_peak_bytes(step(ways[k]))
        rows.append([k, peak, err])
    secs = _interleaved({k: fresh(ways[k]) for k in names}, reps)
    decisions = [str(x) for x in memslim.compiled_decisions() if "fuse-loss-head" in str(x)]
    rewrote = "rewrote" if any("rewrote" in x for x in decisions[-1:]) else "kept"
    base_peak = rows[0][1]
    out = []
    for k, peak, err in rows:
        out.append(
            f"| head {n}x{d}, vocab {vocab:,}, {dtype} | {k} | {peak / 2**20:.1f} | "
            f"{peak / base_peak:.2f}x | {secs[k] / secs['inductor']:.2f}x ({secs[k]:.2f} s) | "
            f"{err:.1e} | {rewrote if k == 'memslim' else ''} |"
        )
    return out


def _causal_lm(kind: str, vocab: int, tokens: int):
    import transformers

    common = dict(vocab_size=vocab, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=256, n_layer=2, n_head=4, n_positions=tokens, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, **common,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(cfg)
    cls = {"llama": "Llama", "qwen2": "Qwen2"}[kind]
    cfg = getattr(transformers, f"{cls}Config")(
        hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=tokens, **common,
    )  # fmt: skip
    return getattr(transformers, f"{cls}ForCausalLM")(cfg)


def model_rows(kind: str, reps: int, vocab=32000, tokens=512, export=True) -> list:
    """One model's rows: torch.compile and memslim.compile (ratios to torch.compile's),
    and with `export` the exported program's module unmodified and rewritten by
    memslim.fx.optimize (ratios to the unmodified one's; both run eagerly)."""
    torch.manual_seed(0)
    model = _causal_lm(kind, vocab, tokens)
    model.config.use_cache = False
    ids = torch.randint(0, vocab, (2, tokens))
    kw = {"input_ids": ids, "labels": ids}

    def grads(f, mod):
        mod.zero_grad(set_to_none=True)
        f(**kw).loss.backward()
        return {k: p.grad.clone() for k, p in mod.named_parameters() if p.grad is not None}

    want = grads(model, model)
    torch._dynamo.reset()
    ways = {"torch.compile": None, "memslim.compile": memslim.compile(model)}
    model.loss_type = "ForCausalLM"  # memslim.compile set it; the same model for both
    ways["torch.compile"] = torch.compile(model)
    mods = {k: model for k in ways}
    base_of = {k: "torch.compile" for k in ways}
    if export:
        plain = torch.export.export(copy.deepcopy(model), (), kw)
        rewritten = torch.export.export(copy.deepcopy(model), (), kw)
        memslim.fx.optimize(rewritten)
        for k, ep in (("torch.export", plain), ("torch.export + memslim.fx.optimize", rewritten)):
            ways[k] = mods[k] = ep.module()
            base_of[k] = "torch.export"
    rows = {}
    for k, f in ways.items():
        got = grads(f, mods[k])
        err = max(_rel(got[n], want[n]) for n in want)
        kept = memslim.saved_bytes(lambda i, f=f: f(input_ids=i, labels=i).loss, ids)
        mods[k].zero_grad(set_to_none=True)
        peak = step_peak_bytes(lambda f=f: f(**kw).loss.backward())
        rows[k] = (kept, peak, err)

    def timed(k):
        def run():
            mods[k].zero_grad(set_to_none=True)
            ways[k](**kw).loss.backward()

        return run

    secs = _interleaved({k: timed(k) for k in ways}, reps)
    recs = [str(x) for x in memslim.report(ways["memslim.compile"]) if "fuse-loss-head" in str(x)]
    out = []
    for k, (kept, peak, err) in rows.items():
        b = base_of[k]
        out.append(
            f"| {kind}, vocab {vocab:,}, 2x{tokens} | {k} | {kept / 2**20:.1f} | "
            f"{peak / 2**20:.1f} ({peak / rows[b][1]:.2f}x) | "
            f"{secs[k] / secs[b]:.2f}x ({secs[k]:.2f} s) | {err:.1e} |"
        )
    out.append(f"|  | records | {'; '.join(r.split(': ', 2)[-1][:160] for r in recs)} | | | |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="vocab 32,000 fp32 head and GPT-2 only")
    ap.add_argument("--part", choices=["head", "models", "all"], default="all")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    lines = [
        f"# The loss head without its logits ({datetime.date.today()}, commit {_commit()}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU)",
        "",
    ]
    if a.part in ("head", "all"):
        lines += [
            "| case | way | peak MiB | peak vs Inductor | step vs Inductor | grad rel. diff "
            "to eager | fuse-loss-head |",
            "|---|---|---|---|---|---|---|",
        ]
        cases = [(32000, "fp32")] if a.quick else [
            (32000, "fp32"), (128256, "fp32"), (32000, "bf16"), (128256, "bf16")
        ]  # fmt: skip
        for vocab, dtype in cases:
            lines += head_rows(vocab, dtype, a.reps)
            print(lines[-1], file=sys.stderr, flush=True)
        lines.append("")
    if a.part in ("models", "all"):
        lines += [
            "| model | way | saved MiB | peak MiB (vs the plain way) | step vs the plain way "
            "(torch.compile / torch.export) | grad rel. diff to eager |",
            "|---|---|---|---|---|---|",
        ]
        for kind in ["gpt2"] if a.quick else ["gpt2", "llama", "qwen2"]:
            lines += model_rows(kind, a.reps)
            print(lines[-2], file=sys.stderr, flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
