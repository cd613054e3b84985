"""One (model, variant) of the benchmark suite, measured in a process of its own.

What: builds the model and the variant, trains a few SGD steps (peak RSS of this process,
gradients at step 1 and at the last step), measures saved-for-backward bytes (with the
tensors' shapes, and cross-checked by walking the autograd graph where the graph shows its
saved tensors), and times forward+backward interleaved with an eager copy. Writes one JSON.
Why a process per variant: peak RSS (ru_maxrss) is per process, torch.compile's config
(activation_memory_budget) is process-wide, and a crash or hang loses one row, not the suite.

Usage (suite.py calls it): _suite_worker.py MODEL VARIANT --batch N --out FILE.json [--threads T]
  [--grads FILE.pt] (eager writes its gradients there, the others compare with them)
  [--sweep 8,16,32] (only saved bytes, at each batch size)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import statistics
import sys
import time
import traceback
import warnings

warnings.filterwarnings("ignore", message=r".*torch\.jit\..*deprecated", category=FutureWarning)

import torch  # noqa: E402

import memslim  # noqa: E402
from _suite_models import SPECS, loss_fn, make_variant  # noqa: E402

WARM_STEPS = 2  # a scripted module profiles on its first call and optimizes on the second
STEADY_STEPS = 1  # steps after the warm-up whose RSS high-water mark is the "step" peak
TIME_REPS = 5  # interleaved timing pairs (variant, eager); medians of these
LR = 0.01  # plain SGD, no momentum: identical arithmetic in every process


# ---- memory of this process ---------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _trim_and_reset_peak() -> float:
    """Gives freed heap back to the OS (malloc_trim) and resets the RSS high-water mark
    (/proc/self/clear_refs "5"); returns RSS now, MiB. Without the trim, memory freed by
    the warm-up steps would still count as resident and hide the step's own growth."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return -1.0
    return _status_kib("VmRSS") / 1024


# ---- saved tensors -------------------------------------------------------------------


def _key(t: torch.Tensor):
    st = t.untyped_storage()
    return (st.data_ptr(), st.nbytes())


class ShapeRecorder:
    """saved_tensors_hooks recorder with memslim.saved_bytes' rules (distinct storages,
    parameters excluded) that also keeps each storage's (shape, dtype, bytes)."""

    def __init__(self, params):
        self.exclude = {_key(p) for p in params}
        self.items = {}

    def pack(self, t):
        k = _key(t)
        if k not in self.exclude and k not in self.items:
            self.items[k] = (tuple(t.shape), str(t.dtype).replace("torch.", ""), k[1])
        return t

    @staticmethod
    def unpack(t):
        return t


def graph_walk_saved(out: torch.Tensor, params):
    """Distinct storage bytes reachable as saved tensors from out.grad_fn, read off the
    autograd nodes themselves: `_saved_*` attributes of aten nodes and ctx.saved_tensors of
    Python autograd.Functions (torch.compile's CompiledFunctionBackward). An independent
    check that saved_tensors_hooks see what torch.compile saves. Returns (bytes, {node type
    -> [(shape, dtype, bytes)]}) or None where a node hides its saved tensors (TorchScript's
    DifferentiableGraph, C++ custom functions such as memslim's ops, checkpoint holders)."""
    exclude = {_key(p) for p in params}
    seen, storages, by_node, stack = set(), {}, {}, [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        kind = type(node).__name__
        if kind in ("DifferentiableGraphBackward", "CppFunction") or kind.startswith(
            "CheckpointFunction"
        ):
            return None
        tensors = []
        if hasattr(node, "saved_tensors"):  # Python autograd.Function: ctx.saved_tensors
            tensors += list(node.saved_tensors)
        for attr in dir(node):
            if attr.startswith("_saved_"):
                v = getattr(node, attr)
                if isinstance(v, torch.Tensor):
                    tensors.append(v)
                elif isinstance(v, (tuple, list)):
                    tensors += [t for t in v if isinstance(t, torch.Tensor)]
        for t in tensors:
            k = _key(t)
            if k not in exclude and k not in storages:
                storages[k] = k[1]
                by_node.setdefault(kind, []).append(
                    (tuple(t.shape), str(t.dtype).replace("torch.", ""), k[1])
                )
        stack += [f for f, _ in node.next_functions]
    return sum(storages.values()), by_node


# ---- training ------------------------------------------------------------------------


def _step(fn, spec, params, x, target):
    """One forward + backward; gradients land in p.grad / x.grad (set to None first)."""
    for p in params:
        p.grad = None
    if x.grad is not None:
        x.grad = None
    loss = loss_fn(spec, fn(x), target)
    loss.backward()
    return loss


def _grads(params, x):
    gs = [None if p.grad is None else p.grad.detach().clone() for p in params]
    gs.append(None if x.grad is None else x.grad.detach().clone())
    return gs


def _sgd(params):
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.sub_(LR * p.grad)


def grad_diff(got, ref):
    """Compares gradient lists (parameters, then the input). Returns (max over tensors of
    ||g - g_ref|| / ||g_ref||, index of the worst, global ||G - G_ref|| / ||G_ref|| over all
    tensors concatenated); (nan, -1, nan) if eager's own gradients are not finite.
    The global figure matters where a tensor's true gradient is zero (BERT's attention key
    bias: softmax ignores a per-query constant; a BN bias followed by a 1x1 conv and BN):
    there the per-tensor ratio divides rounding noise by rounding noise."""
    worst, where, dsq, nsq = 0.0, -1, 0.0, 0.0
    for i, (a, b) in enumerate(zip(got, ref)):
        if a is None and b is None:
            continue
        if b is not None and not torch.isfinite(b).all():
            return float("nan"), -1, float("nan")
        if a is None or b is None:
            return float("inf"), i, float("inf")
        d = (a.double() - b.double()).norm().item()
        n = b.double().norm().item()
        dsq, nsq = dsq + d * d, nsq + n * n
        r = d / n if n > 0 else d
        if r > worst or where < 0:
            worst, where = r, i
    return worst, where, (dsq**0.5) / (nsq**0.5) if nsq > 0 else dsq**0.5


def _fail(res, phase, e):
    # One line. TorchScript wraps errors as "The following operation failed in the TorchScript
    # interpreter." + a traceback: the informative line is the last "...Error: ..." one.
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [""]
    errs = [ln for ln in lines if re.match(r"^[\w.:]+(Error|Exception): ", ln)]
    if errs and "TorchScript interpreter" in lines[0]:
        msg = errs[-1][:200]
    else:
        msg = f"{type(e).__name__}: {lines[0][:200]}"
    res.setdefault("errors", {})[phase] = msg
    traceback.print_exc()


def run(a) -> dict:
    spec = SPECS[a.model]
    res = {
        "model": a.model,
        "variant": a.variant,
        "batch": a.batch,
        "threads": torch.get_num_threads(),
        # the extension's build time: the checkout may be rebuilt while the suite runs
        "memslim_built": os.path.getmtime(memslim._C.__file__),
    }
    x, target = spec.make_inputs(a.batch)
    if x.is_floating_point():
        x.requires_grad_(True)  # the input gradient is compared too (token ids have none)

    # Build. The variant shares the model's Parameters (see make_variant).
    t0 = time.perf_counter()
    model = spec.build()
    fn, note = make_variant(a.variant, model, x.detach())
    params = list(model.parameters())
    names = [n.replace(".inner.", ".") for n, _ in model.named_parameters()] + ["input"]
    res.update(note=note, build_s=time.perf_counter() - t0, n_params=len(params))
    res["rss_built_mib"] = _status_kib("VmRSS") / 1024

    # Train: WARM_STEPS, then STEADY_STEPS with the RSS high-water mark reset before them.
    grads = {}
    n_steps = WARM_STEPS + STEADY_STEPS
    for k in range(1, n_steps + 1):
        if k == WARM_STEPS + 1:
            res["rss_base_mib"] = _trim_and_reset_peak()
        t = time.perf_counter()
        _step(fn, spec, params, x, target)
        if k == 1:
            res["first_step_s"] = time.perf_counter() - t  # includes torch.compile's compilation
        if k in (1, n_steps):
            grads[k] = _grads(params, x)
        _sgd(params)
    res["note"] = str(note)  # memslim.compile's is known after the first call
    res["rss_step_peak_mib"] = _status_kib("VmHWM") / 1024
    res["ru_maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["steps"] = n_steps

    # Correctness: gradients against eager's (same initial weights, inputs, steps).
    if a.variant == "eager":
        if a.grads:
            torch.save(grads, a.grads)
    elif a.grads and os.path.exists(a.grads):
        ref = torch.load(a.grads)
        for key, k in (("step1", 1), ("last", n_steps)):
            value, worst, glob = grad_diff(grads[k], ref[k])
            res[f"grad_rel_{key}"], res[f"grad_glob_{key}"] = value, glob
            res[f"grad_worst_{key}"] = names[worst] if worst >= 0 and value > 0 else ""
        del ref
    else:
        res.setdefault("errors", {})["grads"] = "no eager gradients (eager row failed)"
    del grads

    # Saved-for-backward bytes: memslim.saved_bytes (the figure), then one forward under
    # ShapeRecorder (the multiset for the breakdown) whose output's autograd graph is also
    # walked. Both after the training steps, so scripted modules are past profiling.
    try:
        res["saved_bytes"] = memslim.saved_bytes(fn, x, warmup=0)
        rec = ShapeRecorder(params)
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
            out = fn(x)
        res["saved_recorder"] = sum(v[2] for v in rec.items.values())
        res["saved_tensors"] = sorted(rec.items.values(), key=lambda v: -v[2])
        if a.variant in ("eager", "compile", "compile_budget"):
            walked = graph_walk_saved(out, params)
            if walked is not None:
                res["saved_graph_walk"] = walked[0]
                res["saved_by_node"] = walked[1]
        del out, rec
    except Exception as e:
        _fail(res, "saved", e)

    # Step time: forward+backward of the variant and of an eager copy, interleaved (the order
    # alternates per pair) so that load from other processes hits both alike; medians.
    try:
        # The eager copy gets the variant's current weights and buffers (after the
        # training steps above): a fresh copy ran at other values, which for FracAct
        # (whose SGD steps overflow to NaN weights) put eager's own row at 0.68-0.82x.
        # (By position: checkpoint wrappers rename the variant's keys, not their order.)
        ref_model = spec.build()
        with torch.no_grad():
            pairs = list(zip(ref_model.parameters(), model.parameters())) + list(
                zip(ref_model.buffers(), model.buffers())
            )
            if all(a.shape == b.shape and a.dtype == b.dtype for a, b in pairs):
                for a, b in pairs:
                    a.copy_(b)
        ref_params = list(ref_model.parameters())
        _step(ref_model, spec, ref_params, x, target)  # warm the eager copy once
        times = {"v": [], "e": []}
        for r in range(TIME_REPS):
            order = (("v", fn, params), ("e", ref_model, ref_params))
            for tag, f, ps in order if r % 2 == 0 else order[::-1]:
                t = time.perf_counter()
                _step(f, spec, ps, x, target)
                times[tag].append(time.perf_counter() - t)
        res["step_ms"] = 1000 * statistics.median(times["v"])
        res["eager_step_ms"] = 1000 * statistics.median(times["e"])
        res["step_ratio"] = res["step_ms"] / res["eager_step_ms"]
        res["step_times_ms"] = {k: [round(1000 * t, 1) for t in v] for k, v in times.items()}
    except Exception as e:
        _fail(res, "timing", e)
    return res


def sweep(a) -> dict:
    """Saved bytes only, at each batch size of --sweep (for the plots). torch.compile
    specializes on the first batch and recompiles once with a dynamic batch dimension."""
    spec = SPECS[a.model]
    model = spec.build()
    x0, _ = spec.make_inputs(int(a.sweep.split(",")[0]))
    fn, note = make_variant(a.variant, model, x0)
    out = {"model": a.model, "variant": a.variant, "note": str(note), "sweep": {}}
    for b in [int(s) for s in a.sweep.split(",")]:
        x, _ = spec.make_inputs(b)
        if x.is_floating_point():
            x.requires_grad_(True)
        # warmup=2: a scripted module re-profiles when the batch size changes.
        out["sweep"][b] = memslim.saved_bytes(fn, x, warmup=2 if a.variant != "eager" else 0)
        print(f"{a.model} {a.variant} batch {b}: {out['sweep'][b]:,}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("variant")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--grads", default="")
    ap.add_argument("--sweep", default="")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    try:
        res = sweep(a) if a.sweep else run(a)
    except Exception as e:  # build or training failed: the row records why
        res = {"model": a.model, "variant": a.variant}
        _fail(res, "run", e)
    with open(a.out, "w") as f:
        json.dump(res, f)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
