"""Models, inputs, losses and variants of the benchmark suite (bench/suite.py).

What: one registry of the suite's models (torchvision, transformers, and a tiny CNN for
`--quick`) and one function per variant that turns a freshly built model into what is
measured (eager, scripted/traced, memslim.optimize, per-block checkpointing,
torch.compile with and without an activation memory budget).
Why here: the driver (suite.py) and the measuring subprocess (_suite_worker.py) must
build byte-identical models and inputs; both import this file.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# torch.jit.script / trace / save warn as deprecated in torch 2.14: only those warnings.
warnings.filterwarnings("ignore", message=r".*torch\.jit\..*deprecated", category=FutureWarning)

# Order of the columns/rows everywhere; "eager" first: the other workers compare with it.
VARIANTS = (
    "eager",
    "script",
    "memslim",
    "ckpt",
    "compile",
    "compile_budget",
    "memslim_export",
    "memslim_compile",
    "memslim_compile_budget",
    "memslim_budget",
    "memslim_compile_plan",
)
# The budget of the *_budget variants (bench/memory_budget.py sets it per run).
BUDGET = float(os.environ.get("MEMSLIM_SUITE_BUDGET", "0.5"))
VARIANT_TITLES = {
    "eager": "eager",
    "script": "scripted/traced",
    "memslim": "memslim.optimize",
    "ckpt": "checkpoint per block",
    "compile": "torch.compile",
    "compile_budget": f"torch.compile, budget {BUDGET:g}",
    "memslim_export": "memslim.fx.optimize (torch.export)",
    "memslim_compile": "torch.compile(backend=memslim)",
    "memslim_compile_budget": f"torch.compile(backend=memslim), budget {BUDGET:g}",
    "memslim_budget": f"memslim.optimize, memory_budget {BUDGET:g}",
    "memslim_compile_plan": f"memslim.compile, memory_budget {BUDGET:g}",
}

# Block classes wrapped by the "ckpt" variant: one checkpoint per residual block /
# inverted-residual block / ConvNeXt block / transformer layer (matched by class name so
# the transformers classes need no import here).
CKPT_BLOCKS = {
    "BasicBlock",
    "Bottleneck",
    "MBConv",
    "InvertedResidual",
    "CNBlock",
    "EncoderBlock",
    "BertLayer",
    "GPT2Block",
    "LlamaDecoderLayer",
    "TinyBlock",
}


@dataclass
class Spec:
    """One benchmarked model: how to build it, its inputs and its loss."""

    name: str
    build: Callable[[], torch.nn.Module]  # fresh model, seeded: same weights every call
    make_inputs: Callable[[int], Tuple[torch.Tensor, torch.Tensor]]  # batch -> (input, target)
    batch: int  # default batch of the full run
    shape: str  # input description for the tables
    family: str  # "vision" (logits, CE loss) or "hf" (hidden states)
    needs: str = "torchvision"  # optional package the builder imports


def zero_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Sets every nn.Dropout's and StochasticDepth's p to 0 (in place).

    Why: every variant must compute the same function, and torch.compile draws its random
    numbers differently from eager and TorchScript, so "same seed" would not give the same
    masks. p=0 keeps the modules (and the graphs' structure) where the model has them.
    """
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return model


def _tv(arch: str, act: str = "relu", **kwargs) -> Callable[[], torch.nn.Module]:
    def build():
        if kwargs:  # constructor arguments (vit's image_size): build directly, seeded alike
            import torchvision

            torch.manual_seed(0)
            model = getattr(torchvision.models, arch)(**kwargs)
        else:  # the shared builder, which also swaps the activation ("relu": unchanged)
            from memslim._models import torchvision_with

            model = torchvision_with(arch, act, seed=0)
        return zero_dropout(model)

    return build


def _image(c: int, hw: int):
    def make(batch: int):
        g = torch.Generator().manual_seed(1234)
        return (
            torch.randn(batch, c, hw, hw, generator=g),
            torch.randint(0, 1000, (batch,), generator=g),
        )

    return make


class HFWrap(torch.nn.Module):
    """transformers model -> plain tensor out (last_hidden_state), so that it traces, compiles
    and feeds the same loss as everything else."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def _hf(kind: str) -> Callable[[], torch.nn.Module]:
    def build():
        import transformers

        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        # Dropout off through the configs (p=0), use_cache off: training, and a KV cache
        # would be filled again by checkpointing's recomputation.
        if kind == "bert":
            cfg = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
            model = transformers.BertModel(
                cfg, add_pooling_layer=False
            )  # pooler unused by the loss
        elif kind == "gpt2":
            cfg = transformers.GPT2Config(
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False
            )
            model = transformers.GPT2Model(cfg)
        else:  # small Llama: 4 layers, d=512, MLP 4x with SiLU (the config's default act)
            cfg = transformers.LlamaConfig(
                hidden_size=512,
                intermediate_size=2048,
                num_hidden_layers=4,
                num_attention_heads=8,
                num_key_value_heads=8,
                vocab_size=32000,
                max_position_embeddings=512,
                attention_dropout=0.0,
                hidden_act="silu",
                use_cache=False,
            )
            model = transformers.LlamaModel(cfg)
        return HFWrap(zero_dropout(model))

    return build


def _tokens(vocab: int, seq: int):
    def make(batch: int):
        g = torch.Generator().manual_seed(1234)
        ids = torch.randint(0, vocab, (batch, seq), generator=g)
        return ids, torch.zeros(())  # no target: the loss is on the hidden states

    return make


class TinyBlock(torch.nn.Module):
    """conv-BN-GELU-conv-BN + identity, GELU: a residual block small enough for --quick."""

    def __init__(self, c: int):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.act(self.b2(self.c2(self.act(self.b1(self.c1(x))))) + x)


class TinyNet(torch.nn.Module):
    """Stem conv + 2 TinyBlocks + pool + Linear(16, 10): the --quick model."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = torch.nn.Sequential(TinyBlock(16), TinyBlock(16))
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.blocks(F.gelu(self.stem(x))).mean((2, 3)))


def _tiny():
    torch.manual_seed(0)
    return TinyNet()


def _tiny_inputs(batch: int):
    g = torch.Generator().manual_seed(1234)
    return torch.randn(batch, 3, 16, 16, generator=g), torch.randint(0, 10, (batch,), generator=g)


# Sizes of the full run (2 CPU cores, the whole suite in ~40 min): CNNs at batch 32 x 3x64x64
# (a quarter of ImageNet's side; every stage keeps a spatial extent >= 2), ViT-B/16 at
# image_size 64 (random weights, 16 patches + class token), transformers at batch 4 x 64 tokens:
# 4 x 128 costs ~5 s per eager step on 2 cores for BERT/GPT-2, which with ~14 steps per
# variant, 6 variants and 3 models alone would take half the budget.
# suite.py's --img / --hf-seq reach the worker processes through these environment variables.
IMG = int(os.environ.get("MEMSLIM_SUITE_IMG", "64"))
HF_SEQ = int(os.environ.get("MEMSLIM_SUITE_HF_SEQ", "64"))
SPECS: Dict[str, Spec] = {
    s.name: s
    for s in [
        Spec("resnet18", _tv("resnet18"), _image(3, IMG), 32, f"32x3x{IMG}x{IMG}", "vision"),
        Spec("resnet50", _tv("resnet50"), _image(3, IMG), 32, f"32x3x{IMG}x{IMG}", "vision"),
        Spec(
            "resnet18_gelu",
            _tv("resnet18", "gelu"),
            _image(3, IMG),
            32,
            f"32x3x{IMG}x{IMG}",
            "vision",
        ),
        Spec(
            "resnet50_gelu",
            _tv("resnet50", "gelu"),
            _image(3, IMG),
            32,
            f"32x3x{IMG}x{IMG}",
            "vision",
        ),
        Spec(
            "resnet18_frac",
            _tv("resnet18", "frac"),
            _image(3, IMG),
            32,
            f"32x3x{IMG}x{IMG}",
            "vision",
        ),
        Spec(
            "resnet50_frac",
            _tv("resnet50", "frac"),
            _image(3, IMG),
            32,
            f"32x3x{IMG}x{IMG}",
            "vision",
        ),
        Spec(
            "efficientnet_b0",
            _tv("efficientnet_b0"),
            _image(3, IMG),
            32,
            f"32x3x{IMG}x{IMG}",
            "vision",
        ),
        Spec(
            "mobilenet_v3_large",
            _tv("mobilenet_v3_large"),
            _image(3, IMG),
            32,
            f"32x3x{IMG}x{IMG}",
            "vision",
        ),
        Spec(
            "convnext_tiny", _tv("convnext_tiny"), _image(3, IMG), 32, f"32x3x{IMG}x{IMG}", "vision"
        ),
        Spec(
            "vit_b_16",
            _tv("vit_b_16", image_size=IMG),
            _image(3, IMG),
            32,
            f"32x3x{IMG}x{IMG}",
            "vision",
        ),
        Spec(
            "bert",
            _hf("bert"),
            _tokens(30522, HF_SEQ),
            4,
            f"4x{HF_SEQ} tokens",
            "hf",
            "transformers",
        ),
        Spec(
            "gpt2",
            _hf("gpt2"),
            _tokens(50257, HF_SEQ),
            4,
            f"4x{HF_SEQ} tokens",
            "hf",
            "transformers",
        ),
        Spec(
            "llama_small",
            _hf("llama"),
            _tokens(32000, HF_SEQ),
            4,
            f"4x{HF_SEQ} tokens",
            "hf",
            "transformers",
        ),
        Spec("tiny", _tiny, _tiny_inputs, 2, "2x3x16x16", "vision", ""),
    ]
}
FULL_MODELS = [n for n in SPECS if n != "tiny"]


def loss_fn(spec: Spec, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the logits for vision models; mean square of the last hidden state
    for the transformers backbones (no head: any loss that touches every output works)."""
    if spec.family == "vision":
        return F.cross_entropy(out, target)
    return out.float().square().mean()


class CkptWrap(torch.nn.Module):
    """Runs `inner` under torch.utils.checkpoint (non-reentrant): autograd keeps the block's
    inputs and recomputes its insides in backward."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)

    def __getattr__(self, name):
        # transformers' model loops read attributes of their layers (attention_type ...).
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)


def wrap_blocks(model: torch.nn.Module) -> int:
    """Wraps every CKPT_BLOCKS module of `model` in CkptWrap (in place, not nested);
    returns how many were wrapped."""
    n = 0
    for name, child in model.named_children():
        if type(child).__name__ in CKPT_BLOCKS:
            setattr(model, name, CkptWrap(child))
            n += 1
        else:
            n += wrap_blocks(child)
    return n


def script_or_trace(model: torch.nn.Module, x: torch.Tensor):
    """torch.jit.script(model), else torch.jit.trace(model, x, check_trace=False).

    Returns (module, "scripted" | "traced: <why script failed>")."""
    try:
        return torch.jit.script(model), "scripted"
    except Exception as e:  # transformers models do not script (source / typing limits)
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        why = re.sub(r"<function (\S+) at 0x[0-9a-f]+>", r"\1", why)[:70]
        return torch.jit.trace(model, (x,), check_trace=False), f"traced (script failed: {why})"


def _rewrites(memslim, program) -> str:
    """Rewrites per pass and the predicted bytes, from the decision records."""
    counts = {}
    for d in memslim.report(program):
        if d.verdict == "rewrote":
            counts[d.pass_] = counts.get(d.pass_, 0) + 1
    done = ", ".join(f"{n} {p}" for p, n in counts.items()) or "nothing rewritten"
    return f"{done}; predicted freed {memslim.predicted_bytes_freed(program):,} B"


class _LazyNote:
    """A note known after the first call (torch.compile compiles then)."""

    def __init__(self, fn):
        self.fn = fn

    def __str__(self):
        return self.fn()


def make_variant(variant: str, model: torch.nn.Module, x: torch.Tensor):
    """Turns a freshly built `model` into the callable measured as `variant`.

    Returns (callable, note). The callable shares `model`'s parameters (scripting, tracing,
    memslim.optimize, checkpoint wrappers and torch.compile all keep the same Parameter
    objects), so an SGD step on model.parameters() trains it."""
    if variant == "eager":
        return model, ""
    if variant == "script":
        return script_or_trace(model, x)
    if variant == "memslim":
        import memslim

        scripted, how = script_or_trace(model, x)
        opt = memslim.optimize(scripted, (x,))
        return opt, f"{how}; {_rewrites(memslim, opt)}"
    if variant == "memslim_budget":
        import memslim
        from memslim.measure import saved_bytes_quietly

        # The budget in bytes of what eager keeps (the suite's reference; a traced
        # module can keep more than eager: llama_small 1.09x, vit_b_16 1.10x).
        budget = int(BUDGET * saved_bytes_quietly(model, (x,), {}))
        scripted, how = script_or_trace(model, x)
        opt = memslim.optimize(scripted, (x,), memory_budget=budget)
        chosen = [
            str(d)
            for d in memslim.report(opt)
            if d.pass_ == "memory-budget" and d.verdict == "note"
        ][:2]
        return opt, (
            f"{how}; budget {BUDGET} of eager ({budget:,} B); "
            + " / ".join(c.split(": ", 2)[-1] for c in chosen)
        )
    if variant == "ckpt":
        n = wrap_blocks(model)
        if n == 0:
            raise RuntimeError("no block to checkpoint")
        return model, f"{n} blocks checkpointed"
    if variant == "memslim_export":
        # The FX front end on torch.export's training IR; the module it gives trains
        # the same Parameter objects.
        import memslim

        ep = memslim.fx.optimize(torch.export.export(model, (x,)))
        return ep.module(), _rewrites(memslim, ep)
    if variant in ("compile", "compile_budget", "memslim_compile", "memslim_compile_budget"):
        if variant.endswith("_budget"):
            from torch._functorch import config as functorch_config

            # The min-cut partitioner then keeps at most half of what it would save and
            # recomputes the rest (a process-wide setting: one variant per process).
            functorch_config.activation_memory_budget = BUDGET
        if variant.startswith("memslim"):
            import memslim

            compiled = memslim.compile(model)
            return compiled, _LazyNote(lambda: _rewrites(memslim, compiled))
        return torch.compile(model), ""
    if variant == "memslim_compile_plan":
        # memslim's own planner under torch.compile: memory_budget=BUDGET of what
        # Inductor's partitioner keeps for each graph (torch's activation_memory_budget
        # left at its default), blocks recomputed through recompute tags.
        import memslim

        compiled = memslim.compile(model, memory_budget=BUDGET)

        def note():
            plans = [d.text for d in memslim.report(compiled) if d.pass_ == "memory-budget"]
            return (
                f"memory_budget {BUDGET} of Inductor's partition; "
                + _rewrites(memslim, compiled)
                + "; "
                + " | ".join(t for t in plans if t.startswith("budget"))[:600]
            )

        return compiled, _LazyNote(note)
    raise ValueError(f"unknown variant {variant}")
