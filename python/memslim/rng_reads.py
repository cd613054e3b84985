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
    """Whether an aten-level graph reads the RNG state and also draws random numbers
    (budget.knapsack._draws_random_numbers: an idle dropout or attention draws nothing) or
    calls an op memslim cannot vouch for, so the read's place in the program matters."""
    from .budget.knapsack import _draws_random_numbers

    reads = draws = False
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        t = n.target
        if t is torch.ops.memslim.rng_state.default:
            reads = True
        elif isinstance(t, torch._ops.HigherOrderOperator) or _draws_random_numbers(n):
            draws = True
        elif isinstance(t, torch._ops.OpOverload) and t.namespace not in _VOUCHED:
            draws = True
    return reads and draws


_VOUCHED = ("aten", "prims", "memslim")  # namespaces whose ops draw only where tagged so
