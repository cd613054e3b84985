"""The suite's models in bf16 autocast: eager, torch.compile, backend="memslim", memslim.compile.

What: for each model (small configs of the suite's resnet50, a GELU resnet18, BERT, GPT-2
and a small Llama, from torchvision / transformers), one training step under
`torch.autocast("cpu", dtype=torch.bfloat16)` through eager, plain torch.compile
(Inductor), torch.compile(backend="memslim") and memslim.compile(memory_budget=0.5)
(`--all-ways`: also memslim.optimize and torch.export + memslim.fx.optimize), measured by
memslim.probe: saved-for-backward bytes (saved_tensors_hooks), step time (rounds
interleaved in one process, medians, as a ratio to torch.compile's), each gradient's
distance to a float64 run of the same step (relative L2, the worst tensor) and that
distance over eager bf16's own (probe.error_ratio_to_eager), and which rewrites memslim
made and kept in each graph (its decision records). Writes a markdown table.
Why: issue 46 asks whether memslim's rewrites pay in 16-bit, where its activation kernels
run 1.5-7.7x aten's time (bench/results/op_speed*.md) and Inductor re-runs pointwise ops
fused; this puts bytes, time and gradients of the real front ends side by side.

    .venv/bin/python bench/autocast_bf16.py --out bench/results/autocast_bf16_<date>.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from collections import Counter

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memslim import probe as P  # noqa: E402


def _tv(arch, act="relu"):
    def build():
        from memslim._models import torchvision_with

        return torchvision_with(arch, act, seed=0)

    return build


class _HF(torch.nn.Module):
    """transformers backbone -> last hidden state (the suite's HFWrap)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def _hf(kind, layers, dim):
    def build():
        import transformers

        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        heads, ff = max(dim // 64, 1), 4 * dim
        if kind == "bert":
            cfg = transformers.BertConfig(
                hidden_size=dim,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                intermediate_size=ff,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )
            model = transformers.BertModel(cfg, add_pooling_layer=False)
        elif kind == "gpt2":
            cfg = transformers.GPT2Config(
                n_embd=dim,
                n_layer=layers,
                n_head=heads,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                use_cache=False,
            )
            model = transformers.GPT2Model(cfg)
        else:
            cfg = transformers.LlamaConfig(
                hidden_size=dim,
                intermediate_size=ff,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=heads,
                vocab_size=32000,
                max_position_embeddings=512,
                hidden_act="silu",
                use_cache=False,
            )
            model = transformers.LlamaModel(cfg)
        return _HF(model)

    return build


def _ce(out, target):
    return torch.nn.functional.cross_entropy(out, target)


def _sq(out, target):
    return out.float().square().mean()


def models(args):
    g = torch.Generator().manual_seed(1234)
    img = (torch.randn(args.batch, 3, args.img, args.img, generator=g),)
    cls = torch.randint(0, 1000, (args.batch,), generator=g)
    ids = (torch.randint(0, 30000, (args.tokens_batch, args.seq), generator=g),)
    hf = f"{args.layers} layers, d {args.dim}, {args.tokens_batch}x{args.seq} tokens"
    im = f"{args.batch}x3x{args.img}x{args.img}"
    return {
        "resnet50": (_tv("resnet50"), [(img, cls)], _ce, im),
        "resnet18_gelu": (_tv("resnet18", "gelu"), [(img, cls)], _ce, im),
        "bert": (_hf("bert", args.layers, args.dim), [(ids, None)], _sq, hf),
        "gpt2": (_hf("gpt2", args.layers, args.dim), [(ids, None)], _sq, hf),
        "llama_small": (_hf("llama", args.layers, args.dim), [(ids, None)], _sq, hf),
    }


def _backend(model, args):
    """torch.compile(model, backend="memslim") as a user writes it."""
    import memslim

    compiled = torch.compile(model, backend="memslim")
    return compiled, (lambda: memslim.report(compiled))


def ways(all_ways: bool):
    out = [
        P.Way("eager", P._eager),
        P.Way("torch.compile", P._torch_compile(None)),
        P.Way('backend="memslim"', _backend),
        P.Way("memslim.compile(0.5)", P._budget(0.5)),
    ]
    if all_ways:
        out += [P.Way("memslim.optimize", P._torchscript), P.Way("export+fx.optimize", P._export)]
    return out


def _rewrites(row) -> str:
    """Per pass, rewritten sites; then whether the graph(s) took them."""
    if row.records is None:
        return ""
    c = Counter(d.pass_ for d in row.records if d.verdict == "rewrote")
    text = ", ".join(f"{p} x{n}" for p, n in sorted(c.items())) or "none"
    left = sum(n.endswith("graph left to Inductor") for n in row.notes)
    kept = sum(n.endswith("rewrites kept") for n in row.notes)
    plan = [n for n in row.notes if n.startswith("budget ") and "(parameters excluded): " in n]
    if plan:  # the budget planner's way: the rewrites above are its pipeline's candidates
        how = plan[0].split("(parameters excluded): ", 1)[1].split(";")[0]
        text = f"budget: {how[:110]} (pipeline's candidates: {text})"
    elif left or kept:
        text += f"; graphs kept {kept}, left to Inductor {left}"
    sixteen = [n for n in row.notes if "16-bit" in n]
    if sixteen:
        text += f"; {len(sixteen)} 16-bit note(s)"
    return text


def table(name, shape, rows) -> list:
    eager, tc = rows[0], next((r for r in rows if r.way == "torch.compile"), None)
    tc_t = sorted(tc.times)[len(tc.times) // 2] if tc and tc.times else None
    lines = [
        f"### {name} ({shape})",
        "",
        "| way | saved MiB | x eager | x torch.compile | step x torch.compile | grad err vs fp64 "
        "| x eager's | memslim's rewrites |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.error:
            lines.append(f"| {r.way} | failed: {r.error} | | | | | | |")
            continue
        med = sorted(r.times)[len(r.times) // 2] if r.times else None
        err = max(r.grad_errors.values()) if r.grad_errors else None
        ratio = P.error_ratio_to_eager(r, eager)
        lines.append(
            f"| {r.way} | {r.saved / 2**20:.2f} | {r.saved / eager.saved:.2f} | "
            + (f"{r.saved / tc.saved:.2f}" if tc and tc.saved else "-")
            + " | "
            + (f"{med / tc_t:.2f}" if med and tc_t else "-")
            + " | "
            + ("-" if err is None else f"{err:.1e}")
            + " | "
            + ("-" if ratio is None else f"{ratio:.2f}")
            + f" | {_rewrites(r)} |"
        )
    return lines + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="default: all")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--img", type=int, default=32)
    ap.add_argument("--tokens-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--all-ways", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    table_of = models(args)
    names = args.models or list(table_of)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    load0 = os.getloadavg()
    t0 = time.time()
    out = []
    for name in names:
        factory, batches, loss, shape = table_of[name]
        print(f"== {name}", flush=True)
        # A fresh Dynamo per model: the transformers models share _HF.forward's code, and a
        # code object's cache entries stop at Dynamo's recompile limit (8), after which the
        # frame runs eager without a word (llama_small's memslim.compile row kept eager's
        # bytes when it ran after bert and gpt2 in one process).
        torch._dynamo.reset()
        rows = P.probe(
            factory,
            batches,
            loss,
            ways(args.all_ways),
            steps=2,
            rounds=args.rounds,
            autocast=torch.bfloat16,
            progress=lambda s: print("  " + s, flush=True),
        )
        out += table(name, shape, rows)
        print("\n".join(table(name, shape, rows)), flush=True)
        for r in rows:
            for n in r.notes:
                if "16-bit" in n:
                    print(f"  {r.way}: {n}", flush=True)
    head = [
        "# bf16 autocast: the suite's models through each way in",
        "",
        f"Command: `.venv/bin/python bench/autocast_bf16.py {' '.join(sys.argv[1:])}`",
        "",
        f"{datetime.date.today()}, commit {commit}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), {platform.machine()}; CPU bf16 autocast "
        f"(`torch.autocast('cpu', dtype=torch.bfloat16)`), backward outside it. Load average "
        f"{load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
        f"({time.time() - t0:.0f} s) on 2 cores shared with other runs: times are "
        "indicative (each way's rounds are interleaved with the others' in one process, "
        f"median of {args.rounds}).",
        "",
        "saved: distinct storages autograd keeps in one forward (parameters excluded). grad "
        "err: the worst parameter gradient's ||g - g64|| / ||g64|| against a float64 run of "
        "the same step; x eager's: the worst tensor's error over eager bf16's own on that "
        "tensor (floor 2^-10); above 2 fails issue 46's bar.",
        "",
    ]
    text = "\n".join(head + out)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
