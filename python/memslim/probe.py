"""A model's training step through each of memslim's ways in, side by side with eager.

What: `probe(factory, inputs, ...)` builds the model once, copies it per way (eager,
memslim.optimize's TorchScript module, torch.export + memslim.fx.optimize, torch.compile
with memslim's backend, memslim.compile with a memory target), trains each a few steps
from the same weights on the same batches, and measures saved-for-backward bytes
(saved_tensors_hooks: distinct storages, parameters excluded), the step's peak (the
profiler's memory events from the step's start), step time as a ratio to eager (rounds
interleaved, medians), the step-1 gradient difference to eager (relative L2, the worst
tensor; judged against a float64 run of the same step), and what memslim rewrote (its
decision records).
Why: the main job (`python -m memslim demo`) and the probe of a user's own model
(`python -m memslim MODULE:FACTORY`) print the same table from the same measurements.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

# Gradients are compared at step 1, per tensor, in relative L2 norm (||g - g_ref|| /
# ||g_ref||). A way's gradient is beyond rounding when its error against a float64 run of
# the same step exceeds GRAD_FACTOR x eager's own error against it plus GRAD_TOL (the
# measure of test/python/test_optimize.py's assert_training_error_like_eager): torch.compile
# and TorchScript drift from eager by themselves, by reordered sums.
GRAD_TOL = 1e-4
GRAD_FACTOR = 4.0


@dataclass
class Way:
    name: str
    build: Callable  # (model, example_args) -> (callable, records or None)
    short: str = ""  # the picture's label


@dataclass
class Row:
    way: str
    short: str = ""
    saved: Optional[int] = None
    peak: Optional[int] = None
    ratio: Optional[float] = None
    grad_diff: Optional[float] = None  # to eager's, relative L2, the worst tensor
    grad_excess: Optional[float] = None  # error vs fp64 / (GRAD_FACTOR x eager's + GRAD_TOL)
    # each gradient's ||g - g64|| / ||g64|| against the float64 run (empty without one)
    grad_errors: Dict[str, float] = field(default_factory=dict)
    first_step_s: Optional[float] = None
    notes: List[str] = field(default_factory=list)  # the records' notes, and the way's own
    records: Optional[list] = None  # memslim's decision records (None: a way without memslim)
    error: Optional[str] = None
    times: List[float] = field(default_factory=list)


@contextlib.contextmanager
def _stderr_off():
    """File descriptor 2 to /dev/null: kineto prints a line at each profiler start and stop
    (and a GPU-count error on a machine without one) from C++."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def step_peak_bytes(step: Callable[[], object]) -> int:
    """The highest sum of live CPU tensor allocations during step(), from its start
    (torch.profiler's [memory] events, c10's allocations and frees in time order)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _stderr_off():
        prof.start()
    try:
        step()
    finally:
        with _stderr_off():
            prof.stop()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def saved_bytes_of_step(fn, args, loss_fn, params) -> int:
    """Distinct storage bytes autograd keeps during one forward + loss (parameters
    excluded); the graph is released by a backward afterwards."""
    from .measure import _SavedRecorder

    rec = _SavedRecorder(params)
    with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
        loss = loss_fn(fn(*args))
    loss.backward()
    return sum(rec.storages.values())


def rewrote_text(row: "Row") -> str:
    """The rewrites per pass; under torch.compile, whether Inductor got them (the backend
    keeps a graph's rewrites only where Inductor's partitioner then keeps fewer bytes)."""
    rewrote = Counter(d.pass_ for d in row.records or () if d.verdict == "rewrote")
    text = ", ".join(f"{p} x{n}" for p, n in sorted(rewrote.items())) or "nothing"
    met = [
        n.split(": met ", 1)[1].split(" (")[0]
        for n in row.notes
        if n.startswith("budget ") and ": met " in n
    ]
    if met:  # the memory-budget planner's way, per graph
        return "budget met " + "; ".join(dict.fromkeys(met))
    left = sum(n.endswith("graph left to Inductor") for n in row.notes)
    kept = sum(n.endswith("rewrites kept") for n in row.notes)
    if left and not kept:
        return f"none kept ({left} graph(s) left to Inductor, which keeps fewer bytes without)"
    if left:
        return text + f"; {left} graph(s) left to Inductor"
    return text


def zero_dropout(model: torch.nn.Module) -> int:
    """Sets every nn.Dropout's (and torchvision's StochasticDepth's) p to 0; returns how
    many had p > 0. torch.compile draws its random numbers differently from eager, so the
    ways' gradients compare only without them."""
    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) or type(m).__name__ == "StochasticDepth":
            n += m.p > 0
            m.p = 0.0
    return n


# --- the ways in ---------------------------------------------------------------------------


def _eager(model, args):
    return model, None


def _torchscript(model, args):
    import memslim

    try:
        out = memslim.optimize(model, tuple(args))
    except Exception as e:  # noqa: BLE001  (scripting fails on much real code: trace instead)
        traced = torch.jit.trace(model, tuple(args), check_trace=False)
        out = memslim.optimize(traced, tuple(args))
        out._memslim_note = f"traced (torch.jit.script failed: {_first_line(e)})"
    return out, memslim.report(out)


def _export(model, args):
    import memslim

    ep = torch.export.export(model, tuple(args))
    memslim.fx.optimize(ep)
    return ep.module(), memslim.report(ep)


def _compile(model, args):
    import memslim

    compiled = memslim.compile(model)
    return compiled, (lambda: memslim.report(compiled))


def _budget(fraction):
    def build(model, args):
        import memslim

        compiled = memslim.compile(model, memory_budget=fraction)
        return compiled, (lambda: memslim.report(compiled))

    return build


def _torch_compile(fraction: Optional[float]):
    """Plain torch.compile (Inductor), at torch's own activation_memory_budget where given:
    the reference a memslim way is held to."""

    def build(model, args):
        from torch._functorch import config as functorch_config

        compiled = torch.compile(model)
        if fraction is None:
            return compiled, None

        def run(*a):  # the partitioner reads the budget when the first call compiles
            with functorch_config.patch(activation_memory_budget=fraction):
                return compiled(*a)

        return run, None

    return build


def default_ways(
    memory_budget: Optional[float] = None,
    torchscript: bool = True,
    export: bool = True,
    compile: bool = True,
    torch_compile: bool = False,
) -> List[Way]:
    """eager, then memslim's ways; torch_compile: plain torch.compile too (at torch's
    activation_memory_budget = memory_budget where one is given), as the reference."""
    ways = [Way("eager", _eager)]
    if torch_compile:
        ways.append(
            Way("torch.compile (no memslim)", _torch_compile(None), "torch.compile")
            if memory_budget is None
            else Way(
                f"torch.compile, its budget {memory_budget:g}",
                _torch_compile(memory_budget),
                f"torch.compile\nits budget {memory_budget:g}",
            )
        )
    if torchscript:
        ways.append(Way("TorchScript: memslim.optimize", _torchscript, "TorchScript\nmemslim"))
    if export:
        ways.append(Way("torch.export: memslim.fx.optimize", _export, "torch.export\nmemslim"))
    if compile:
        ways.append(Way('torch.compile(backend="memslim")', _compile, "torch.compile\nmemslim"))
    if memory_budget is not None:
        ways.append(
            Way(
                f"memslim.compile(memory_budget={memory_budget:g})",
                _budget(memory_budget),
                f"memslim.compile\nbudget {memory_budget:g}",
            )
        )
    return ways


def _first_line(e: BaseException) -> str:
    while getattr(e, "inner_exception", None) is not None:  # Dynamo's BackendCompilerFailed
        e = e.inner_exception
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


# --- the probe -----------------------------------------------------------------------------


def _module_of(fn, model) -> torch.nn.Module:
    """The module whose parameters a way trains: its own (a ScriptModule, an exported
    program's module), the compiled module's original, or the model a plain function runs."""
    mod = fn if isinstance(fn, torch.nn.Module) else model
    return getattr(mod, "_orig_mod", mod)


def _named_grads(mod: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in mod.named_parameters() if p.grad is not None}


def _rel(g: torch.Tensor, w: torch.Tensor) -> float:
    g, w = g.double(), w.double()
    if torch.equal(torch.isnan(g), torch.isnan(w)) and torch.isnan(w).any():
        g, w = torch.nan_to_num(g), torch.nan_to_num(w)  # NaN where eager has NaN: equal
    scale = w.norm().item()
    diff = (g - w).norm().item()
    if diff != diff:
        return float("inf")
    return diff / scale if scale > 0 else diff


def grad_difference(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor]) -> float:
    """The worst tensor's ||got - want|| / ||want|| (names matched; a missing or extra
    gradient is infinitely different)."""
    if set(got) != set(want):
        return float("inf")
    return max((_rel(got[n], w) for n, w in want.items()), default=0.0)


def grad_excess(got, eager, exact) -> Optional[float]:
    """The worst tensor's error against the float64 run over what rounding allows:
    ||got - exact|| / ||exact|| / (GRAD_FACTOR * eager's own + GRAD_TOL). Above 1: beyond
    rounding. None without a float64 run."""
    if exact is None:
        return None
    if set(got) != set(exact):
        return float("inf")
    return max(
        (_rel(got[n], x) / (GRAD_FACTOR * _rel(eager[n], x) + GRAD_TOL) for n, x in exact.items()),
        default=0.0,
    )


def error_ratio_to_eager(row: "Row", eager: "Row", floor: float = 2.0**-10) -> Optional[float]:
    """The worst tensor's error against the float64 run over eager's own error on that
    tensor (each at least `floor`: a gradient eager gets to 1e-6 is judged at the floor,
    not at 1e-6): above 2, a way moved a gradient beyond twice eager's rounding. The
    floor's default, 2^-10, is a quarter of bf16's unit roundoff (2^-8): the bar for
    16-bit autocast runs, where eager's own error is ~1e-3-1e-2. None without a float64
    run; inf where the gradients' names differ."""
    if not row.grad_errors or not eager.grad_errors:
        return None
    if set(row.grad_errors) != set(eager.grad_errors):
        return float("inf")
    return max(
        (e / max(eager.grad_errors[n], floor) for n, e in row.grad_errors.items()), default=0.0
    )


def _fp64_grads(model: torch.nn.Module, init, batch, loss_fn) -> Optional[Dict[str, torch.Tensor]]:
    """Step 1's gradients of the model in float64 (no autocast), or None where it cannot
    run in float64."""

    def dbl(v):
        return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    try:
        m = copy.deepcopy(model).double()
        m.load_state_dict(init)  # copies into the float64 parameters
        args, target = batch
        with torch.autocast("cpu", enabled=False):
            loss_fn(m(*[dbl(a) for a in args]), dbl(target)).backward()
        return {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    except Exception:  # noqa: BLE001  (a model that only runs in fp32: the 1e-4 rule alone)
        return None


def probe(
    factory: Callable[[], torch.nn.Module],
    batches: Sequence[tuple],
    loss_fn: Callable,
    ways: Sequence[Way],
    *,
    steps: int = 3,
    rounds: int = 5,
    autocast: Optional[torch.dtype] = None,
    lr: float = 1e-3,
    progress: Callable[[str], None] = print,
) -> List[Row]:
    """Trains factory()'s model `steps` SGD steps through each way, then measures.
    batches: (args, target) pairs, used in turn: the step is loss_fn(model(*args), target).
    The first way is the reference (eager)."""
    torch.manual_seed(0)
    reference = factory()
    reference.train()
    dropped = zero_dropout(reference)
    if dropped:
        progress(
            f"{dropped} dropout module(s) set to p=0 so that the ways' gradients compare "
            "(torch.compile draws other random numbers than eager)"
        )
    init = copy.deepcopy(reference.state_dict())
    rows: List[Row] = []
    live = []  # (row, step)
    eager_grads = None
    exact = _fp64_grads(reference, init, batches[0], loss_fn)

    def ctx():
        if autocast is None:
            return torch.autocast("cpu", enabled=False)
        return torch.autocast("cpu", dtype=autocast)

    for way in ways:
        row = Row(way.name, way.short or way.name)
        rows.append(row)
        model = copy.deepcopy(reference)
        model.load_state_dict(init)
        t0 = time.perf_counter()
        try:
            args, target = batches[0]
            with ctx():
                fn, records = way.build(model, args)
            trained = _module_of(fn, model)
            params = list(trained.parameters())
            opt = torch.optim.SGD(params, lr=lr)

            def step(fn=fn, opt=opt, i=0):
                a, t = batches[i % len(batches)]
                opt.zero_grad(set_to_none=True)
                with ctx():
                    loss = loss_fn(fn(*a), t)
                loss.backward()
                return loss

            step()
            row.first_step_s = time.perf_counter() - t0
            grads = _named_grads(trained)
            if eager_grads is None:
                eager_grads = grads
            row.grad_diff = grad_difference(grads, eager_grads)
            row.grad_excess = grad_excess(grads, eager_grads, exact)
            if exact is not None and set(grads) == set(exact):
                row.grad_errors = {n: _rel(grads[n], x) for n, x in exact.items()}
            opt.step()
            for i in range(1, steps):
                step(i=i)
                opt.step()
            recs = records() if callable(records) else records
            if recs is not None:
                row.records = list(recs)
                row.notes = [d.text for d in recs if d.verdict == "note"]
            note = getattr(fn, "_memslim_note", None)
            if note:
                row.notes.insert(0, note)
            opt.zero_grad(set_to_none=True)
            with ctx():
                row.saved = saved_bytes_of_step(fn, args, lambda out: loss_fn(out, target), params)
            opt.zero_grad(set_to_none=True)
            row.peak = step_peak_bytes(step)
            live.append((row, step))
            progress(
                f"{way.name}: ready in {time.perf_counter() - t0:.1f} s "
                f"(first step {row.first_step_s:.1f} s)"
            )
        except Exception as e:  # noqa: BLE001  (one way failing must not hide the others)
            if os.environ.get("MEMSLIM_PROBE_TRACEBACK") == "1":
                import traceback

                traceback.print_exc()
            row.error = _first_line(e)
            progress(f"{way.name}: failed: {row.error}")

    progress(f"timing: {rounds} interleaved rounds of {len(live)} ways")
    for r in range(rounds):
        order = live[r % len(live) :] + live[: r % len(live)] if live else []
        for row, step in order:
            t = time.perf_counter()
            step()
            row.times.append(time.perf_counter() - t)
    base = statistics.median(rows[0].times) if rows and rows[0].times else None
    for row in rows:
        if row.times and base:
            row.ratio = statistics.median(row.times) / base
    return rows


# --- rendering -----------------------------------------------------------------------------


def mib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB"


def refused(r: Row) -> bool:
    """A memory budget the planner said it cannot meet (BudgetError, naming the smallest
    reachable figure): an answer, not a failure of the way."""
    return bool(r.error) and r.error.startswith("BudgetError")


def beyond_rounding(r: Row) -> bool:
    """A gradient that moved beyond fp32 rounding: against float64 where there is a float64
    run (grad_excess), else more than GRAD_TOL from eager's."""
    if r.grad_excess is not None:
        return r.grad_excess > 1.0
    return r.grad_diff is not None and r.grad_diff > GRAD_TOL


def render(title: str, rows: Sequence[Row]) -> str:
    eager = rows[0] if rows else None
    lines = [
        title,
        f"  {'way':<36} {'saved':>20} {'peak':>20} {'step':>7} {'grad diff':>12}  rewrote",
    ]
    for r in rows:
        if r.error:
            lines.append(f"  {r.way:<36} {'refused' if refused(r) else 'failed'}: {r.error}")
            continue
        rel = lambda a, b: "" if a is None or not b or r is eager else f" {a / b:5.2f}x"
        saved = mib(r.saved) + rel(r.saved, eager.saved)
        peak = mib(r.peak) + rel(r.peak, eager.peak)
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        grad = (
            "-"
            if r is eager or r.grad_diff is None
            else f"{r.grad_diff:.1e}" + (" (!)" if beyond_rounding(r) else "    ")
        )
        what = (
            "(reference)"
            if r is eager
            else "(torch alone)"
            if r.records is None
            else rewrote_text(r)
        )
        lines.append(f"  {r.way:<36} {saved:>20} {peak:>20} {ratio:>7} {grad:>12}  {what}")
    return "\n".join(lines)


def plot(panels: Sequence[tuple], path: str) -> Optional[str]:
    """panels: (title, rows, target bytes or None). A bar per way of saved MiB, the target
    as a dashed line. Returns the path, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (title, rows, target) in zip(axes[0], panels):
        ok = [r for r in rows if r.saved is not None]
        names = [r.short for r in ok]
        vals = [r.saved / 2**20 for r in ok]
        colors = ["#999999" if r.records is None else "#2a7ab9" for r in ok]  # grey: no memslim
        ax.bar(range(len(ok)), vals, color=colors)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        if target is not None:
            ax.axhline(
                target / 2**20,
                color="#c0392b",
                linestyle="--",
                label=f"memory target {target / 2**20:.1f} MiB",
            )
        ax.set_xticks(range(len(ok)))
        ax.set_xticklabels(names, fontsize=7)
        ax.set_ylabel("saved for backward (MiB)")
        ax.bar([0], [0], color="#999999", label="without memslim")
        ax.bar([0], [0], color="#2a7ab9", label="with memslim")
        ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
