"""`python -m memslim`: the main job, and a probe of the user's own model.

python -m memslim demo [--png FILE]
    Two bundled models trained a few steps, eager against memslim's ways in: a ResNet-10
    whose activation is a hand-written trainable formula, and a small Llama-style decoder
    with a memory target. Prints a table per model, writes a PNG of saved bytes against
    the target, exits 1 if a gradient moved beyond fp32 rounding or a way failed.

python -m memslim MODULE:FACTORY --input 8x3x224x224 [--input 8x128:int] [--dtype bf16]
                  [--memory-budget 0.5] [--labels] [--no-torchscript] ...
    MODULE is imported from the current directory (as `uvicorn module:app`), FACTORY()
    returns the nn.Module. One training step per way, the same table, and the decision
    records' summary per pass. Bad input: one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
from typing import List, Optional

import torch  # (memslim's package, imported first by `python -m memslim`, imported it)

_T0 = time.perf_counter()


def _say(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f} s] {msg}", flush=True)


class UsageError(Exception):
    pass


# --- the main job --------------------------------------------------------------------------


def _quiet() -> None:
    import logging
    import warnings

    warnings.filterwarnings(
        "ignore", message=r".*torch\.jit\.\w+.*deprecated", category=FutureWarning
    )
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def demo(png: str, rounds: int) -> int:
    from memslim import _models, probe

    torch.manual_seed(1)
    # The ResNet (ResNet-10: one BasicBlock per stage): batch 16 of 64x64 images, 10 classes.
    imgs = [(torch.randn(16, 3, 64, 64),), (torch.randn(16, 3, 64, 64),)]
    labels = [torch.randint(0, 10, (16,)) for _ in imgs]
    ce = torch.nn.functional.cross_entropy
    _say("ResNet-10 with a hand-written trainable activation (16x3x64x64): building ways")
    # TorchScript and torch.export: the CNN's torch.compile costs a minute of Inductor's cold
    # compile here (the probe runs it: python -m memslim MODULE:FACTORY); the decoder below
    # goes through torch.compile.
    resnet = probe.probe(
        _models.custom_act_resnet,
        list(zip(imgs, labels)),
        ce,
        probe.default_ways(compile=False),
        rounds=rounds,
        progress=lambda m: _say("  " + m),
    )
    # The decoder: 4 sequences of 128 tokens, next-token loss; a memory target of half
    # of what torch.compile keeps.
    vocab, budget = 2048, 0.5
    ids = [torch.randint(0, vocab, (4, 128)) for _ in range(2)]
    _say("Llama-style decoder (2 blocks, d 128, 4x128 tokens, loss in the model): building ways")
    decoder = probe.probe(
        _models.tiny_decoder,
        [((i, i), None) for i in ids],
        lambda loss, _: loss,
        probe.default_ways(memory_budget=budget, torch_compile=True),
        rounds=rounds,
        progress=lambda m: _say("  " + m),
    )
    target = _target(decoder[-1], budget)
    print()
    print(
        probe.render("ResNet-10, hand-written trainable activation (saved, peak: x eager)", resnet)
    )
    print()
    print(probe.render("Llama-style decoder, 2 blocks", decoder))
    last = decoder[-1]
    if target is not None and last.saved is not None:
        verdict = "met" if last.saved <= target else "MISSED"
        print(
            f"  memory target: {budget:g} of what torch.compile keeps for the decoder = "
            f"{probe.mib(target)}; {last.way} keeps {probe.mib(last.saved)}: {verdict}"
        )
    path = probe.plot(
        [
            ("ResNet-10, hand-written activation", resnet, None),
            ("Llama-style decoder", decoder, target),
        ],
        png,
    )
    if path:
        print(f"\nsaved bytes against the memory target: {path}")
    else:
        print("\nno picture: matplotlib is not installed (pip install matplotlib)")
    return _verdict(resnet + decoder)


def _target(row, budget: float) -> Optional[int]:
    """The budget's bytes: `budget` of what Inductor's partitioner keeps for the unmodified
    graphs (the memory-budget records' first figure per graph)."""
    before = [
        d.bytes_before
        for d in row.records or []
        if d.pass_ == "memory-budget"
        and d.bytes_before is not None
        and d.text.startswith("budget ")
    ]
    return int(budget * sum(before)) if before else None


def _verdict(rows) -> int:
    from memslim.probe import GRAD_FACTOR, GRAD_TOL, beyond_rounding, refused

    bad = [r for r in rows if (r.error and not refused(r)) or beyond_rounding(r)]
    for r in bad:
        why = r.error or (
            f"gradient {r.grad_diff:.1e} from eager's (relative L2): beyond rounding "
            f"(its error against float64 is over {GRAD_FACTOR:g}x eager's own + {GRAD_TOL:g})"
        )
        print(f"memslim: FAILED: {r.way}: {why}", file=sys.stderr)
    if not bad:
        print(
            f"gradients: every way within rounding of eager's ({GRAD_FACTOR:g}x eager's own "
            f"error against a float64 run + {GRAD_TOL:g}; grad diff: relative L2 to eager)"
        )
    return 1 if bad else 0


# --- the probe of a user's model -----------------------------------------------------------

_SHAPE = re.compile(r"^(\d+(?:x\d+)*)(?::(float|int|long))?$")


def parse_input(text: str):
    """'8x3x224x224' -> ((8, 3, 224, 224), 'float'); '8x128:int' -> ((8, 128), 'int')."""
    m = _SHAPE.match(text.strip())
    if not m:
        raise UsageError(
            f"--input {text!r}: expected sizes joined by 'x', e.g. 8x3x224x224 or 8x128:int"
        )
    shape = tuple(int(s) for s in m.group(1).split("x"))
    return shape, "int" if m.group(2) in ("int", "long") else "float"


def load_factory(spec: str):
    if ":" not in spec:
        raise UsageError(f"{spec!r}: expected MODULE:FACTORY (e.g. mymodels:make_resnet)")
    mod_name, fn_name = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"cannot import {mod_name!r}: {type(e).__name__}: {e}") from None
    factory = module
    for part in fn_name.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise UsageError(f"module {mod_name!r} has no {fn_name!r}")
    if not callable(factory):
        raise UsageError(f"{spec} is not callable")
    return factory


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() else None
    if getattr(out, "loss", None) is not None:  # transformers' ModelOutput given labels
        return out.loss
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    for v in items:
        t = _first_tensor(v)
        if t is not None:
            return t
    return None


class TensorOut(torch.nn.Module):
    """The user's model with one tensor out, as every way in can trace it: the model's loss
    where it returns one (transformers' outputs given labels=), else its first floating-point
    output. labels: the first input passed as labels= too."""

    def __init__(self, m: torch.nn.Module, labels: bool = False):
        super().__init__()
        self.m, self.labels = m, labels
        if getattr(getattr(m, "config", None), "use_cache", None):
            m.config.use_cache = False  # a KV cache is no training output

    def forward(self, *xs):
        out = self.m(*xs, labels=xs[0]) if self.labels else self.m(*xs)
        t = _first_tensor(out)
        if t is None:
            raise UsageError("the model's output holds no floating-point tensor to train on")
        return t


def probe_user_model(args) -> int:
    from memslim import probe

    factory = load_factory(args.target)
    shapes = [parse_input(s) for s in args.input]
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    try:
        model = factory()
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"{args.target}() raised {type(e).__name__}: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{args.target}() returned {type(model).__name__}, not an nn.Module")
    high = args.high or getattr(getattr(model, "config", None), "vocab_size", None) or 100
    torch.manual_seed(1)
    inputs = tuple(
        torch.randint(0, high, s) if kind == "int" else torch.randn(*s) for s, kind in shapes
    )
    first = [model]

    def make():  # the model the factory returned above, then new ones
        return TensorOut(first.pop() if first else factory(), labels=args.labels)

    def loss_fn(out, _):
        return out if out.dim() == 0 else out.float().pow(2).mean()

    ways = probe.default_ways(
        memory_budget=args.memory_budget,
        torchscript=not args.no_torchscript,
        export=not args.no_export,
        compile=not args.no_compile,
        torch_compile=args.torch_compile,
    )
    _say(
        f"{type(model).__name__}: {len(ways)} ways, inputs "
        + ", ".join("x".join(map(str, s)) for s, _ in shapes)
    )
    rows = probe.probe(
        make,
        [(inputs, None)],
        loss_fn,
        ways,
        steps=args.steps,
        rounds=args.rounds,
        autocast=dtype,
        progress=lambda m: _say("  " + m),
    )
    print()
    print(probe.render(f"{args.target} ({args.dtype})", rows))
    for r in rows[1:]:
        if r.records:
            print(f"\n  {r.way}: " + summary_line(r.records))
    return _verdict(rows)


def summary_line(records) -> str:
    """Per pass: sites rewritten / kept and the bytes its rewrites free."""
    per = {}
    for d in records:
        if d.verdict not in ("rewrote", "kept"):
            continue
        p = per.setdefault(d.pass_, [0, 0, 0])
        if d.verdict == "rewrote":
            p[0] += 1
            p[2] += d.freed_bytes or 0
        else:
            p[1] += 1
    return (
        "; ".join(
            f"{name}: {r} rewritten, {k} kept, {f / 2**20:.1f} MiB freed"
            for name, (r, k, f) in sorted(per.items())
        )
        or "no site found"
    )


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m memslim",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 1)[1],
    )
    ap.add_argument("target", help="'demo', or MODULE:FACTORY")
    ap.add_argument(
        "--input",
        action="append",
        default=[],
        help="an input's sizes, e.g. 8x3x224x224 or 8x128:int (repeat per input)",
    )
    ap.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="autocast dtype of the step (default fp32: no autocast)",
    )
    ap.add_argument(
        "--memory-budget",
        type=float,
        default=None,
        help="also run memslim.compile(memory_budget=...)",
    )
    ap.add_argument(
        "--labels",
        action="store_true",
        help="pass the first input as labels= too (transformers' language models)",
    )
    ap.add_argument(
        "--high",
        type=int,
        default=None,
        help="integer inputs are drawn from [0, HIGH) (default: the model's "
        "config.vocab_size, else 100)",
    )
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--no-torchscript", action="store_true")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument(
        "--torch-compile",
        action="store_true",
        help="also plain torch.compile (at its activation_memory_budget when "
        "--memory-budget is given), for reference",
    )
    ap.add_argument("--png", default="memslim-demo.png", help="demo: where the PNG goes")
    args = ap.parse_args(argv)
    _quiet()
    try:
        if args.steps < 1 or args.rounds < 1:
            raise UsageError("--steps and --rounds must be at least 1")
        if args.target == "demo":
            return demo(args.png, args.rounds)
        if not args.input:
            raise UsageError("give the model's input sizes with --input (e.g. 8x3x224x224)")
        if args.memory_budget is not None and not 0 < args.memory_budget:
            raise UsageError("--memory-budget must be > 0 (a fraction in (0, 1] or bytes)")
        return probe_user_model(args)
    except UsageError as e:
        print(f"memslim: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
