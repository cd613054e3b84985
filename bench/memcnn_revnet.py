"""memcnn's RevNet-38 (issue 45): memslim on the plain network (memcnn's
InvertibleModuleWrapper disabled) against eager, torch.compile and memcnn's own wrapper
(keep_input=False), at CIFAR sizes, through memslim.optimize and (--compile)
memslim.compile.

The network is memcnn 1.5.2's `revnet38` experiment (or, with --net revnet110, its `revnet110`; memcnn/config/experiments.json):
ResNet(RevBasicBlock, [3, 3, 3], channels [32, 32, 64, 112], strides [1, 1, 2, 2], a 3x3
stem, no max-pool, batch_norm_fix off), 10 classes. memcnn's wrapper trains on torch 2.14
only with a `.clone()` after the stem's ReLU (the wrapper frees its input's storage, which
the ReLU keeps for its own backward); the same module serves the head's ReLU, where the
copy changes nothing either.

Two measures of what a forward leaves for backward: memslim.saved_bytes (storages autograd's
saved-tensor hooks see) and the bytes of every tensor the forward made that is still alive
after it (a dispatch mode's weak references; parameters and the input excluded): memcnn's
wrapper keeps its tensors on `ctx`, where saved-tensor hooks do not see them, so only the
second measure counts them (not taken for the compiled ways: their kernels do not pass a
dispatch mode). With --compile also: the step's peak (forward, loss, backward, the
gradients allocated anew: torch.profiler's memory events, probe.step_peak_bytes) and the
step time as medians of interleaved steps, as ratios to eager's and torch.compile's.
Gradients: max |a - b| / max |b| over the input and every parameter against eager (the
wrapper disabled), one step, fp32, and against eager in float64; the two downsampling
shortcuts' BN biases left out (a BatchNorm follows each: their gradient is zero: ~1e-8 in
fp32, ~1e-16 in fp64, against >= 9e-3 for every other tensor; the cut is 1e-6 of the
largest).
Usage: bench/memcnn_revnet.py [--net revnet38|revnet110] [--batch 8] [--compile] [--reps 15] [--out FILE] (needs
`pip install memcnn==1.5.2`).
"""

import argparse
import datetime
import re
import statistics
import subprocess
import sys
import time
import warnings
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import memslim

warnings.filterwarnings("ignore")


# memcnn/config/experiments.json: (layers, channels_per_layer) of each RevNet
NETS = {"revnet38": ([3, 3, 3], [32, 32, 64, 112]), "revnet110": ([9, 9, 9], [32, 32, 64, 128])}
NET = "revnet38"  # main() sets it from --net


def revnet(wrapped: bool, dtype=torch.float32):
    """memcnn's RevNet NET (RevNet-38 unless --net says otherwise)."""
    from memcnn.models.resnet import ResNet, RevBasicBlock
    from memcnn.models.revop import InvertibleModuleWrapper

    layers, channels = NETS[NET]
    torch.manual_seed(0)
    m = ResNet(
        RevBasicBlock,
        layers,
        num_classes=10,
        channels_per_layer=channels,
        strides=[1, 1, 2, 2],
        init_max_pool=False,
        init_kernel_size=3,
        batch_norm_fix=False,
    )
    for mod in m.modules():
        if isinstance(mod, InvertibleModuleWrapper):
            mod.disable = not wrapped
            mod.keep_input = False
    if wrapped:
        m.relu = ReluClone()
    return m.to(dtype)


class ReluClone(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x).clone()


class _Alive(TorchDispatchMode):
    """Weak references to every tensor an op makes while active."""

    def __init__(self):
        super().__init__()
        self.refs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.refs.append(weakref.ref(t))
        return out


def alive_bytes(model, x) -> int:
    """Bytes of the distinct storages the forward made that are alive after it (its
    output held, the graph not yet run backward), the parameters and input excluded."""
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip.add(x.untyped_storage().data_ptr())
    mode = _Alive()
    with mode:
        out = model(x)
    seen = {}
    for r in mode.refs:
        t = r()
        if t is None:
            continue
        st = t.untyped_storage()
        if st.data_ptr() and st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
    out.float().sum().backward()
    for p in model.parameters():
        p.grad = None
    return sum(seen.values())


def grads(model, params, x):
    for p in params:
        p.grad = None
    xx = x.clone().requires_grad_()
    model(xx).square().sum().backward()
    out = [xx.grad] + [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out


def max_rel(a, b):
    """Over the gradients eager's own are not zero in: the downsampling shortcuts' BN biases
    (a BatchNorm follows each, so their gradient is 0 and what is there is rounding noise)."""
    top = max(float(q.abs().max()) for q in b)
    return max(
        float((p - q).abs().max() / q.abs().max())
        for p, q in zip(a, b)
        if float(q.abs().max()) > 1e-6 * top
    )


def chained(opt):
    rs = [str(d) for d in memslim.report(opt) if d.pass_ == "invertible-couplings"]
    n = [int(m.group(1)) for r in rs if (m := re.search(r"(\d+) additive couplings? -> ", r))]
    kept = sum("kept coupling" in r for r in rs)
    return n, kept


def step(fn, mod, x):
    """One training step of `fn` (mod: the module whose parameters it trains)."""
    for p in mod.parameters():
        p.grad = None
    fn(x).square().sum().backward()


def compile_rows(a, x, g_eager, g64):
    """The --compile table: saved bytes, step peak, step time ratios, gradients."""
    from memslim.probe import step_peak_bytes

    torch._dynamo.reset()
    ways = {}
    ways["eager (wrapper disabled)"] = revnet(False)
    ways["memcnn's wrapper (keep_input=False)"] = revnet(True)
    tc = revnet(False)
    ways["torch.compile"] = (torch.compile(tc), tc)
    ms = revnet(False)
    ways["memslim.compile"] = (memslim.compile(ms), ms)
    mo = revnet(False)
    ways["memslim.optimize"] = (memslim.optimize(mo, (x,)), mo)
    ways = {k: v if isinstance(v, tuple) else (v, v) for k, v in ways.items()}
    xr = x.clone().requires_grad_()
    for fn, mod in ways.values():  # compiles, the chains' first (drift-measuring) call
        for _ in range(2):
            step(fn, mod, x)
    # The records of the graph the steps run (an input that requires grad is another
    # graph to Dynamo: saved_bytes's compiles its own).
    chains, kept = chained(ways["memslim.compile"][0])
    out = {}
    for name, (fn, mod) in ways.items():
        g = grads(fn, list(mod.parameters()), x)
        out[name] = {
            "saved": memslim.saved_bytes(fn, xr),
            "peak": step_peak_bytes(lambda: step(fn, mod, x)),
            "eager": max_rel(g, g_eager),
            "fp64": max_rel(g, g64),
            "times": [],
        }
    for _ in range(a.reps):  # interleaved: each round runs every way once
        for name, (fn, mod) in ways.items():
            t0 = time.perf_counter()
            step(fn, mod, x)
            out[name]["times"].append(time.perf_counter() - t0)
    return out, chains, kept


def n_couplings() -> int:
    """The couplings of NET: its blocks without a downsampling shortcut."""
    return sum(hasattr(b, "revblock") for b in revnet(False).modules())


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="")
    ap.add_argument("--net", choices=sorted(NETS), default="revnet38")
    a = ap.parse_args()
    global NET
    NET = a.net
    torch.manual_seed(1)
    x = torch.randn(a.batch, 3, 32, 32)
    eager = revnet(False)
    g_eager = grads(eager, list(eager.parameters()), x)
    x64 = x.double()
    e64 = revnet(False, torch.float64)
    g_e64 = grads(e64, list(e64.parameters()), x64)
    g64 = [g.float() for g in g_e64]
    head = (
        f"memcnn 1.5.2 {a.net}, {a.batch}x3x32x32 fp32, CPU; {datetime.date.today()}, "
        f"commit {commit()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    if a.compile:
        out, chains, kept = compile_rows(a, x, g_eager, g64)
        b64 = revnet(False, torch.float64)
        torch._dynamo.reset()
        c64 = memslim.compile(b64)
        grads(c64, list(b64.parameters()), x64)  # the chains' first call
        rel64 = max_rel(grads(c64, list(b64.parameters()), x64), g_e64)
        te = statistics.median(out["eager (wrapper disabled)"]["times"])
        tc = statistics.median(out["torch.compile"]["times"])
        lines = [
            head,
            "",
            "| way | memslim.saved_bytes | step peak | step time / eager | / torch.compile "
            "| grads vs eager fp32 | vs eager fp64 |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in out.items():
            t = statistics.median(r["times"])
            lines.append(
                f"| {name} | {r['saved']:,} | {r['peak']:,} | {t / te:.2f} | {t / tc:.2f} "
                f"| {r['eager']:.1e} | {r['fp64']:.1e} |"
            )
        lines += [
            "",
            f"memslim.compile: couplings per chain {chains} ({sum(chains)} of {n_couplings()} in chains, "
            f"{kept} kept); fp64 gradients vs eager fp64: {rel64:.1e}; step times: medians of "
            f"{a.reps} interleaved steps (eager {te * 1e3:.1f} ms, torch.compile "
            f"{tc * 1e3:.1f} ms)",
        ]
    else:
        base = revnet(False)
        opt = memslim.optimize(base, (x,))
        chains, kept = chained(opt)
        g_opt = grads(opt, list(base.parameters()), x)
        memcnn = revnet(True)
        g_memcnn = grads(memcnn, list(memcnn.parameters()), x)
        xr = x.clone().requires_grad_()
        rows = [
            ("eager (wrapper disabled)", eager, g_eager),
            ("memslim.optimize (wrapper disabled, traced)", opt, g_opt),
            ("memcnn's wrapper (keep_input=False)", memcnn, g_memcnn),
        ]
        b64 = revnet(False, torch.float64)
        o64 = memslim.optimize(b64, (x64,))
        rel64 = max_rel(grads(o64, list(b64.parameters()), x64), g_e64)
        lines = [
            head,
            "",
            "| way | memslim.saved_bytes | alive after forward | grads vs eager (max rel) |",
            "|---|---:|---:|---:|",
        ]
        for name, m, g in rows:
            sb = memslim.saved_bytes(m, xr)
            ab = alive_bytes(m, x)
            lines.append(f"| {name} | {sb:,} | {ab:,} | {max_rel(g, g_eager):.1e} |")
        lines += [
            "",
            f"memslim: couplings per chain {chains} ({sum(chains)} of {n_couplings()} in chains, {kept} kept); "
            f"fp64 gradients vs eager fp64: {rel64:.1e}",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
