"""transformers' models under torch.compile: Inductor, backend="memslim", memslim.compile(0.5).

What: GPT-2, Llama, Mistral, Qwen2 (causal LM heads), BERT (masked LM), T5 and Whisper
(conditional generation), ViT (image classification), from small transformers configs
(random weights, dropout 0), each trained one step with its own loss (labels in the
batch) in fp32 and in CPU bf16 autocast through eager, plain torch.compile,
torch.compile(backend="memslim") and memslim.compile(memory_budget=0.5). Per cell:
whether the step ran and every fallback seen (the memslim ways run under MEMSLIM_STRICT=1,
so a backend fallback or a frame Dynamo gave up on is an error naming its cause; Dynamo's
own counters, frames tried - frames compiled, are read beside it), saved-for-backward bytes
(saved_tensors_hooks: distinct storages, parameters excluded; measure._SavedRecorder, as
memslim.saved_bytes), the step time as a ratio to torch.compile's (rounds interleaved in
one process, medians), and the step-1 gradients' agreement: fp32, global relative L2 to
eager's, beside torch.compile's own; bf16, global relative L2 to a float64 run of the same
step, over eager bf16's own (issue 46's bar: within 2x).
Each (model, dtype) runs in a subprocess of its own (a crash or a hang loses one cell; a
fresh Dynamo each, so no code object nears its recompile limit across cells); rows go to a
JSON-lines cache, so a run resumes where it stopped.

    .venv/bin/python bench/zoo_compile.py                      # every cell (resumable)
    .venv/bin/python bench/zoo_compile.py --models gpt2,t5 --dtypes bf16 --rerun
    .venv/bin/python bench/zoo_compile.py --render             # only the markdown

Why: issue 46 asks for the transformers zoo under torch.compile, every cell run, no
model whose step fails under memslim where it runs under Inductor, and no fallback.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
DEFAULT_CACHE = os.path.join(RESULTS, "zoo_compile.jsonl")
DEFAULT_MD = os.path.join(RESULTS, "zoo_compile_2026-11-29.md")
sys.path.insert(0, HERE)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# One layer (two for the encoder-decoders: one each): the grid's 16 cells must fit in
# ~40 min on 2 loaded cores, and the first compile of each way is most of a cell
# (GPT-2 at 2 layers, a cold Inductor cache, load 11: 299 s for plain torch.compile).
BATCH, SEQ, VOCAB, IMG, MELS, LAYERS = 4, 64, 1000, 64, 16, 1
_S = dict(
    hidden_size=128,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    intermediate_size=512,
    vocab_size=VOCAB,
    max_position_embeddings=128,
)
_DEC = dict(_S, num_key_value_heads=4, use_cache=False)
# name -> (model class, config class, config kwargs, the batch's keywords)
MODELS = {
    "gpt2": (
        "GPT2LMHeadModel",
        "GPT2Config",
        dict(
            n_embd=128, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=128, use_cache=False
        ),
        ("input_ids", "labels"),
    ),
    "llama": ("LlamaForCausalLM", "LlamaConfig", _DEC, ("input_ids", "labels")),
    "mistral": ("MistralForCausalLM", "MistralConfig", _DEC, ("input_ids", "labels")),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", _DEC, ("input_ids", "labels")),
    "bert": ("BertForMaskedLM", "BertConfig", _S, ("input_ids", "labels")),
    "t5": (
        "T5ForConditionalGeneration",
        "T5Config",
        dict(
            d_model=128,
            d_ff=512,
            d_kv=32,
            num_layers=LAYERS,
            num_heads=4,
            vocab_size=VOCAB,
            pad_token_id=0,
            decoder_start_token_id=0,
        ),
        ("input_ids", "labels"),
    ),
    "vit": (
        "ViTForImageClassification",
        "ViTConfig",
        dict(_S, image_size=IMG, patch_size=8, num_labels=10),
        ("pixel_values", "labels"),
    ),
    "whisper": (
        "WhisperForConditionalGeneration",
        "WhisperConfig",
        dict(
            d_model=128,
            encoder_layers=LAYERS,
            decoder_layers=LAYERS,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=512,
            decoder_ffn_dim=512,
            vocab_size=VOCAB,
            num_mel_bins=MELS,
            max_source_positions=SEQ // 2,
            max_target_positions=SEQ,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
        ),
        ("input_features", "labels"),
    ),
}
DTYPES = ("fp32", "bf16")
WAYS = ("eager", "torch.compile", 'backend="memslim"', "memslim.compile(0.5)")
BF16_BAR = 2.0  # issue 46: bf16 gradients within 2x eager bf16's distance to float64
FLOOR = 2.0**-10  # a tensor's eager bf16 error is judged at least this (probe's floor)


# ---- the model and its batch ------------------------------------------------------------


def build(name: str):
    """(the task module: forward(*batch) -> the model's loss, the batch, a note)."""
    import transformers

    transformers.logging.set_verbosity_error()
    model_cls, cfg_cls, kw, keys = MODELS[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(**kw)
    for k, v in list(vars(cfg).items()):  # dropout off: compiled RNG differs from eager
        if isinstance(v, float) and ("drop" in k or k.endswith("pdrop")):
            setattr(cfg, k, 0.0)
    model = getattr(transformers, model_cls)(cfg)
    note = ""
    if model.loss_type is None:
        # transformers' loss_function warns (warning_once) when loss_type is unset, and
        # Dynamo breaks the graph there; "ForCausalLM" is what it picks anyway (the same
        # memslim.compile does for a PreTrainedModel: memslim/_transformers.py).
        model.loss_type = "ForCausalLM"
        note = "loss_type set to ForCausalLM (unset in the class)"
    g = torch.Generator().manual_seed(1234)
    if keys[0] == "pixel_values":
        first = torch.randn(BATCH, 3, IMG, IMG, generator=g)
        labels = torch.randint(0, 10, (BATCH,), generator=g)
    elif keys[0] == "input_features":
        first = torch.randn(BATCH, MELS, SEQ, generator=g)
        labels = torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=g)
    else:
        first = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
        labels = first.clone()
    return Task(model, keys), (first, labels), note


class Task(torch.nn.Module):
    """model(**dict(zip(keys, batch))).loss: the step a user's loop takes, with the batch
    as positional tensors (the float64 reference calls it the same way)."""

    def __init__(self, model, keys):
        super().__init__()
        self.model, self.keys = model, tuple(keys)

    def forward(self, *batch):
        return self.model(**dict(zip(self.keys, batch))).loss


# ---- the worker: one (model, dtype) ------------------------------------------------------


def _dynamo_counts():
    from torch._dynamo.utils import counters

    return (
        counters["frames"]["total"],
        counters["frames"]["ok"],
        dict(counters["unimplemented"]),
        sum(counters["graph_break"].values()),
    )


def _dynamo_delta(before) -> dict:
    total, ok, unimpl, breaks = _dynamo_counts()
    new = {k.split("\n")[0]: v - before[2].get(k, 0) for k, v in unimpl.items()}
    return {
        "frames": total - before[0],
        "frames_compiled": ok - before[1],
        "frames_given_up": (total - before[0]) - (ok - before[1]),
        "given_up_causes": {k: v for k, v in new.items() if v > 0},
        "graph_breaks": breaks - before[3],
    }


def _grads(module):
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def _global_rel(got, ref) -> float:
    """||G - G_ref|| / ||G_ref|| over every tensor (a missing one counts in full)."""
    dsq = nsq = 0.0
    for k, b in ref.items():
        b = b.double()
        a = got.get(k)
        d = b.norm().item() if a is None else (a.double() - b).norm().item()
        dsq, nsq = dsq + d * d, nsq + b.norm().item() ** 2
    if set(got) - set(ref):
        return float("inf")
    return (dsq**0.5) / (nsq**0.5) if nsq > 0 else dsq**0.5


def _per_tensor(got, ref) -> dict:
    out = {}
    for k, b in ref.items():
        a = got.get(k)
        n = b.double().norm().item()
        d = b.double().norm().item() if a is None else (a.double() - b.double()).norm().item()
        out[k] = d / n if n > 0 else d
    return out


def _fallback_notes(rep) -> list:
    """memslim's records saying a graph or frame was not compiled as memslim planned."""
    return [
        d.text
        for d in rep
        if d.verdict == "note" and d.pass_ in ("memslim-backend", "dynamo-fallback")
    ]


def _make(way, model):
    """(what the step calls, what memslim.report reads or None) for one way."""
    import memslim

    if way == "eager":
        return model, None
    if way == "torch.compile":
        return torch.compile(model), None
    if way == 'backend="memslim"':
        c = torch.compile(model, backend="memslim")
        return c, c
    return (c := memslim.compile(model, memory_budget=0.5)), c


def _read_report(row: dict, reported) -> None:
    """Graphs, fallbacks, rewrites per pass and the notes of memslim's records, into row."""
    import memslim

    rep = memslim.report(reported)
    row["graphs"] = len(rep.graphs)
    row["fallbacks"] = _fallback_notes(rep)
    rewrote = {}
    for d in rep:
        if d.verdict == "rewrote":
            rewrote[d.pass_] = rewrote.get(d.pass_, 0) + 1
    row["rewrote"] = rewrote
    row["notes"] = [d.text[:300] for d in rep if d.verdict == "note"][:12]


def _grad_rows(res: dict, grads: dict, g64: dict) -> None:
    """Each way's step-1 gradients against eager's and the float64 run's, into res."""
    eager = grads.get("eager")
    eager64 = _per_tensor(eager, g64) if eager else None
    for way, g in grads.items():
        row = res["ways"][way]
        row["grad_vs_eager"] = _global_rel(g, eager) if eager else None
        row["grad_vs_fp64"] = _global_rel(g, g64)
        if eager64 is not None:
            mine = _per_tensor(g, g64)
            worst = max(mine, key=lambda k: mine[k] / max(eager64[k], FLOOR))
            row["worst_tensor_vs_eager_err"] = [worst, mine[worst] / max(eager64[worst], FLOOR)]


def worker(name: str, dtype: str, rounds: int, out_path: str) -> None:
    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")
    from memslim.measure import _SavedRecorder

    res = {"model": name, "dtype": dtype, "phase": "build", "ways": {}}

    def save():
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f)
        os.replace(tmp, out_path)

    t_start = time.time()
    reference, batch, note = build(name)
    reference.train()
    res["note"] = note
    res["params"] = sum(p.numel() for p in reference.parameters())
    init = copy.deepcopy(reference.state_dict())
    bf16 = dtype == "bf16"

    def ctx():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    # The float64 reference: the same step, no autocast.
    res["phase"] = "fp64"
    save()
    m64 = copy.deepcopy(reference).double()
    m64.load_state_dict(init)
    b64 = tuple(t.double() if t.is_floating_point() else t for t in batch)
    m64(*b64).backward()
    g64 = _grads(m64)
    del m64

    live = []
    grads = {}
    for way in WAYS:
        row = res["ways"].setdefault(way, {})
        res["phase"] = way
        save()
        model = copy.deepcopy(reference)
        model.load_state_dict(init)
        strict = way not in ("eager", "torch.compile")
        if strict:
            os.environ["MEMSLIM_STRICT"] = "1"
        before = _dynamo_counts()
        t0 = time.perf_counter()
        try:
            fn, reported = _make(way, model)
            params = list(model.parameters())
            opt = torch.optim.SGD(params, lr=1e-3)

            def step(fn=fn, opt=opt):
                opt.zero_grad(set_to_none=True)
                with ctx():
                    loss = fn(*batch)
                loss.backward()
                return loss

            row["loss"] = step().item()
            row["first_step_s"] = round(time.perf_counter() - t0, 1)
            grads[way] = _grads(model)
            opt.step()
            for _ in range(2):
                step()
                opt.step()
            opt.zero_grad(set_to_none=True)
            rec = _SavedRecorder(params)
            with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack), ctx():
                loss = fn(*batch)
            loss.backward()
            row["saved"] = sum(rec.storages.values())
            opt.zero_grad(set_to_none=True)
            if reported is not None:
                _read_report(row, reported)
            live.append((way, step))
        except Exception as e:  # noqa: BLE001  (one way failing must not hide the others)
            row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400]}"
            row["traceback"] = traceback.format_exc()[-3000:]
        finally:
            os.environ.pop("MEMSLIM_STRICT", None)
        row["dynamo"] = _dynamo_delta(before)
        row["ready_s"] = round(time.perf_counter() - t0, 1)
        save()

    res["phase"] = "timing"
    save()
    times = {w: [] for w, _ in live}
    for r in range(rounds):
        order = live[r % len(live) :] + live[: r % len(live)] if live else []
        for way, step in order:
            t = time.perf_counter()
            step()
            times[way].append(time.perf_counter() - t)
    for way, ts in times.items():
        res["ways"][way]["step_s"] = statistics.median(ts)
    _grad_rows(res, grads, g64)
    res["phase"] = "done"
    res["wall_s"] = round(time.time() - t_start, 1)
    save()


# ---- the driver ----------------------------------------------------------------------------


def _load(cache):
    rows = {}
    if os.path.exists(cache):
        with open(cache) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    rows[(r["model"], r["dtype"])] = r
    return rows


def run_cell(name, dtype, rounds, timeout, cache):
    out = os.path.join(RESULTS, f".zoo_compile_{name}_{dtype}.json")
    if os.path.exists(out):
        os.remove(out)
    t0 = time.time()
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        name,
        dtype,
        "--rounds",
        str(rounds),
        "--json",
        out,
    ]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, tail = p.returncode, (p.stderr or "")[-1500:]
    except subprocess.TimeoutExpired:
        rc, tail = "timeout", f"killed after {timeout} s"
    res = {"model": name, "dtype": dtype, "ways": {}}
    if os.path.exists(out):
        with open(out) as f:
            res = json.load(f)
        os.remove(out)
    if res.get("phase") != "done":
        res["crash"] = f"rc {rc} in phase {res.get('phase')}: {tail.strip().splitlines()[-1:]}"
    res["cell_s"] = round(time.time() - t0, 1)
    with open(cache, "a") as f:
        f.write(json.dumps(res) + "\n")
    return res


# ---- the table -----------------------------------------------------------------------------


def _mib(n):
    return "-" if n is None else f"{n / 2**20:.2f}"


def _cell_runs(row) -> str:
    if row.get("error"):
        return "**failed**: " + row["error"][:160].replace("|", "/")
    d = row.get("dynamo", {})
    bits = ["yes"]
    if row.get("fallbacks"):
        bits.append("**fallback**: " + "; ".join(row["fallbacks"])[:160].replace("|", "/"))
    if d.get("frames_given_up"):
        causes = ", ".join(d.get("given_up_causes", {})) or "?"
        bits.append(f"**{d['frames_given_up']} frame(s) Dynamo gave up**: {causes}")
    bits.append(f"{d.get('frames_compiled', 0)} frame(s), {d.get('graph_breaks', 0)} break(s)")
    return "; ".join(bits)


def _rewrites(row) -> str:
    """The rewrites per pass; under a budget, the planner's way (its candidates after)."""
    text = ", ".join(f"{p} x{n}" for p, n in sorted(row.get("rewrote", {}).items())) or "none"
    plan = [n for n in row.get("notes", []) if n.startswith("budget ") and "excluded): " in n]
    if plan:
        how = plan[0].split("excluded): ", 1)[1].split(" (")[0].split(",")[0]
        return f"budget {how} (the pipeline's candidates: {text})"
    return text


def render(rows: dict, meta: dict) -> str:
    lines = [
        "# transformers' models under torch.compile: Inductor, memslim's backend, memslim.compile(0.5)",
        "",
        f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}, transformers "
        f"{meta['transformers']}, 1 thread per cell, {platform.machine()} CPU; "
        f"`{meta['command']}`. Load average {meta.get('load', '?')} on 2 cores shared with "
        "other runs: step ratios are indicative.",
        "",
        "Method: each (model, dtype) in a subprocess of its own; the model from a "
        f"transformers config (hidden 128, {LAYERS} layer(s) (per stack), 4 heads, vocab 1,000, dropout 0, random "
        f"weights), a batch of {BATCH} x {SEQ} tokens (ViT: {BATCH} x 3 x {IMG} x {IMG}, "
        f"patch 8; Whisper: {BATCH} x {MELS} mel bins x {SEQ} frames, {SEQ // 2} label "
        "tokens), the model's own loss from labels. Each way trains 3 SGD steps from the "
        "same weights; step-1 gradients are compared. memslim's ways run with "
        "MEMSLIM_STRICT=1 (a fallback raises, naming its cause). runs: whether the step ran, "
        "any fallback (memslim's records, Dynamo's counters: frames tried but not compiled, "
        "with their causes), frames Dynamo compiled and graph breaks. saved: distinct "
        "storages autograd keeps in one forward (parameters excluded), MiB. step: median of "
        "interleaved rounds over torch.compile's. grad fp32: ||G - G_eager|| / ||G_eager|| "
        "over all parameter gradients. grad bf16: ||G - G_fp64|| / ||G_fp64|| over eager "
        "bf16's own, and the worst tensor's ratio (each tensor's eager error floored at "
        "2^-10); issue 46's bar is 2.",
        "",
        "| model | dtype | way | runs | saved MiB | x torch.compile | step x torch.compile "
        "| grad | memslim's rewrites |",
        "|---|---|---|---|---:|---:|---:|---|---|",
    ]
    for name in MODELS:
        for dtype in DTYPES:
            res = rows.get((name, dtype))
            if res is None:
                lines.append(f"| {name} | {dtype} | - | not run | | | | | |")
                continue
            ways = res.get("ways", {})
            if not ways:
                lines.append(
                    f"| {name} | {dtype} | - | **crashed**: {res.get('crash', '')[:200]} | | | | | |"
                )
                continue
            tc = ways.get("torch.compile", {})
            eager = ways.get("eager", {})
            for way in WAYS:
                row = ways.get(way)
                if row is None:
                    lines.append(
                        f"| {name} | {dtype} | {way} | not reached ({res.get('crash', '')}) | | | | | |"
                    )
                    continue
                saved = row.get("saved")
                xs = f"{saved / tc['saved']:.2f}" if saved and tc.get("saved") else "-"
                st = (
                    f"{row['step_s'] / tc['step_s']:.2f}"
                    if row.get("step_s") and tc.get("step_s")
                    else "-"
                )
                if dtype == "fp32":
                    g = row.get("grad_vs_eager")
                    grad = "-" if g is None or way == "eager" else f"{g:.1e}"
                else:
                    g, e = row.get("grad_vs_fp64"), eager.get("grad_vs_fp64")
                    w = row.get("worst_tensor_vs_eager_err")
                    grad = "-"
                    if g is not None and e:
                        grad = f"{g:.1e} ({g / e:.2f}x eager's"
                        grad += f"; worst tensor {w[1]:.2f}x)" if w else ")"
                rew = _rewrites(row) if way not in ("eager", "torch.compile") else ""
                lines.append(
                    f"| {name} | {dtype} | {way} | {_cell_runs(row)} | {_mib(saved)} | {xs} "
                    f"| {st} | {grad} | {rew} |"
                )
            if res.get("crash"):
                lines.append(
                    f"| {name} | {dtype} | (cell) | **crashed**: {res['crash'][:200]} | | | | | |"
                )
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--cache", default=DEFAULT_CACHE)
    ap.add_argument("--out", default=DEFAULT_MD)
    ap.add_argument("--rerun", action="store_true", help="run cells already in the cache again")
    ap.add_argument("--render", action="store_true", help="only write the markdown")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "DTYPE"), help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.rounds, args.json)
        return
    import transformers

    rows = _load(args.cache)
    if not args.render:
        for name in args.models.split(","):
            for dtype in args.dtypes.split(","):
                if (name, dtype) in rows and not args.rerun:
                    continue
                print(f"== {name} {dtype}", flush=True)
                res = run_cell(name, dtype, args.rounds, args.timeout, args.cache)
                rows[(name, dtype)] = res
                for way, row in res.get("ways", {}).items():
                    print(f"  {way}: {_cell_runs(row)} saved {_mib(row.get('saved'))}", flush=True)
                if res.get("crash"):
                    print("  crashed: " + res["crash"], flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": "python bench/zoo_compile.py " + " ".join(sys.argv[1:]),
        "load": f"{os.getloadavg()[0]:.1f}",
    }
    text = render(rows, meta)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
