"""RNG-state reads inside memslim.compile's graphs: `torch.get_rng_state()` as an op.

Dynamo breaks the graph at every `torch.get_rng_state()` (trace_rules marks it skipped:
AOTAutograd would not see a read that is no aten op). Reversible libraries call it once per
block (revlib 1.7.2's ReversibleModule.forward, whatever its memory mode), so no graph holds
two couplings and memslim's chains never form. While a memslim.compile'd model runs,
`torch.get_rng_state` (and `torch.random.get_rng_state`) is memslim's getter: where Dynamo
traces, `memslim::rng_state`, an op that returns what torch.get_rng_state returns, which
Dynamo puts in the graph like any op; elsewhere (eager code, Dynamo saving the generator
around its trace) torch's own getter.

Where it is safe: a read returns the generator's state at that point of the program. A graph
that draws no random numbers leaves the generator as it found it, so the read returns the
same wherever Inductor schedules it. A graph that also draws random numbers (dropout, a
chain whose F draws) runs as Dynamo captured it, ops in program order (backend._backend
checks `reads_and_draws`), with a record saying so. Only the CPU generator's getter is
treated; torch.cuda.get_rng_state still breaks the graph.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

_lock = threading.RLock()
_depth = 0
_ORIGINAL = torch.random.get_rng_state


@torch.library.custom_op("memslim::rng_state", mutates_args=())
def rng_state() -> torch.Tensor:
    """The CPU generator's state, as torch.get_rng_state() returns it."""
    return _ORIGINAL()


@rng_state.register_fake
def _(*_args):
    # The state's size is the generator's, fixed per build (5056 bytes for mt19937).
    return torch.empty(_ORIGINAL().numel(), dtype=torch.uint8)


def get_rng_state() -> torch.Tensor:
    """torch.get_rng_state while a memslim.compile'd model runs: the op where Dynamo
    traces, torch's own getter elsewhere (eager code, Dynamo's own state saving)."""
    if torch.compiler.is_compiling():
        return torch.ops.memslim.rng_state()
    return _ORIGINAL()


@contextlib.contextmanager
def in_graph():
    """torch.get_rng_state / torch.random.get_rng_state as memslim::rng_state (nested
    calls and threads share one installation, undone when the last one leaves)."""
    global _depth
    with _lock:
        if _depth == 0:
            torch.get_rng_state = get_rng_state
            torch.random.get_rng_state = get_rng_state
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.get_rng_state = _ORIGINAL
                torch.random.get_rng_state = _ORIGINAL


def traced(fn):
    """fn (a compiled forward) with RNG-state reads traced into its graphs."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with in_graph():
            return fn(*args, **kwargs)

    return call


def reads_and_draws(gm: torch.fx.GraphModule) -> bool:
    """Whether an aten-level graph reads the RNG state and also draws random numbers (or
    calls an op memslim cannot vouch for), so the read's place in the program matters."""
    reads = draws = False
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        t = n.target
        if t is torch.ops.memslim.rng_state.default:
            reads = True
        elif isinstance(t, torch._ops.OpOverload):
            ns = t.namespace
            if _idle_dropout(n):
                continue
            if torch.Tag.nondeterministic_seeded in t.tags or ns not in (
                "aten",
                "prims",
                "memslim",
            ):
                draws = True
        elif isinstance(t, torch._ops.HigherOrderOperator):
            draws = True
    return reads and draws


_DROPOUTS = ("dropout", "native_dropout", "feature_dropout", "alpha_dropout")


def _idle_dropout(n: torch.fx.Node) -> bool:
    """A dropout with a constant p == 0 or train == False: ATen returns before drawing
    (nn.Dropout(0.0) in training mode draws nothing)."""
    t = n.target
    if t.namespace != "aten" or t._schema.name.split("::")[-1] not in _DROPOUTS:
        return False
    args = list(n.args) + [None] * 3
    p = n.kwargs.get("p", args[1])
    train = n.kwargs.get("train", args[2])
    return (isinstance(p, (int, float)) and p == 0) or train is False
