"""Frames Dynamo gave up on: counted in memslim's reports, an error under strict mode.

What: torch.compile runs a frame eager when Dynamo gives up on it: its recompile limit
(torch._dynamo.config.recompile_limit, 8 per code object; from then on the code runs only
the graphs already cached, and eager for every object none of them fits), a graph break it
cannot resume from, any other soft failure of a frame's trace. The training goes on, the
frame keeps eager's bytes, and only a log line says so (the recompile limit's at WARNING,
the others at INFO, not shown by default). torch 2.14.1 reports each such frame once, where
it suppresses the exception (`ConvertFrame.__call__` in torch/_dynamo/convert_frame.py logs
it with exc_info on the logger torch._dynamo.convert_frame). `watch()` (memslim's import)
puts a filter on that logger: for a frame of an object compiled with memslim's backend
(found on the stack as compiled.py finds a graph's owner), the frame joins the object's
graphs as a "dynamo-fallback" note naming the code and the cause (memslim.report,
memslim.summary), and under strict mode (memslim.compile(strict=True), MEMSLIM_STRICT=1)
the filter raises FallbackError instead, which Dynamo hands to the caller. The logger is
set to INFO so that the INFO record is made; the filter passes on only what the logger's
parent would have shown, so torch's output is unchanged. `frames_given_up(obj)`: where the
limit was hit for another object, an object whose own calls of that code now run eager
without any event (no cache entry of its backend) is found at report time.
Why a log filter: Dynamo has no callback for a frame it gives up on (its compile-end
callbacks run inside the trace, before the recompile limit's check and without the
exception), and its counters (torch._dynamo.utils.counters) are per process, not per
object.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from typing import List, Optional, Tuple

from . import records as store
from .records import Decision, note

PASS = "dynamo-fallback"
_LOGGER = "torch._dynamo.convert_frame"
# code object -> the cause, for frames Dynamo gave up on at its recompile limit (Dynamo
# then runs them eager for every object no cached graph fits, without a word).
_LIMITED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_INSTALLED: List[logging.Filter] = []
# Frames Dynamo never compiles, by its design, not by giving up: a generator's frame
# reached from eager code (DDP's hooks run a `typing` genexpr at every call; the frame
# that calls it runs eager anyway, and Dynamo inlines generators it meets while tracing).
NEVER_COMPILED = ("Attempt to trace generator",)


class FallbackError(RuntimeError):
    """Under strict mode: a frame of a model compiled with memslim's backend that Dynamo
    gave up on (it would run eager)."""


def _where(code) -> str:
    return f"{code.co_name} at {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"


def _converting_code():
    """The code object of the frame Dynamo is converting (ConvertFrame.__call__'s
    `frame` argument, found on the stack), or None."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "__call__" and f.f_code.co_filename.endswith("convert_frame.py"):
            frame = f.f_locals.get("frame")
            code = getattr(frame, "f_code", None)
            if code is not None:
                return code
        f = f.f_back
    return None


def _cause(exc, limit) -> str:
    gb = getattr(exc, "gb_type", None) or ""
    if gb == "Dynamo recompile limit exceeded":
        what = "Dynamo's recompile limit"
        if limit is not None:
            what = f"Dynamo's {limit[0]} ({limit[1]})"
            if limit[2]:
                what += f"; its last recompile reason: {str(limit[2]).splitlines()[0][:200]}"
        return what
    first = str(getattr(exc, "msg", exc)).strip().splitlines()
    text = gb or (first[0] if first else "")
    stack = getattr(exc, "real_stack", None)
    if stack:
        at = stack[-1]
        text += f" (at {at.filename.rsplit('/', 1)[-1]}:{at.lineno})"
    return f"{type(exc).__name__}: {text}"[:300]


def _memslim_owner() -> Optional[Tuple[object, object, "store.Graphs"]]:
    """(owner, its original module or None, its Graphs) of the torch.compile wrapper on the
    stack, where its backend is memslim's; else None."""
    from . import compiled

    found = compiled._owner_on_stack(with_context=True)
    if found is None:
        return None
    owner, orig, _, ctx = found
    graphs = store.lookup(owner)
    if graphs is not None:
        return owner, orig, graphs
    if not compiled._is_memslim(compiled._innermost_backend(getattr(ctx, "callback", None))):
        return None
    from .backend import backend

    graphs = store.keep(
        owner,
        store.Graphs(
            "torch.compile(backend='memslim')", (backend, compiled._share_root(owner, orig))
        ),
    )
    if orig is not None and store.lookup(orig) is None:
        store.keep(orig, graphs)
    return owner, orig, graphs


def strict_for(graphs) -> bool:
    return bool(getattr(graphs, "strict", False)) or os.environ.get("MEMSLIM_STRICT") == "1"


class _Watch(logging.Filter):
    def __init__(self, logger: logging.Logger):
        super().__init__()
        self.logger = logger
        self.limit = None  # the recompile limit's last warning: (type, value, reason)

    def _shown(self, record) -> bool:
        parent = self.logger.parent
        return record.levelno >= (parent.getEffectiveLevel() if parent else logging.WARNING)

    def filter(self, record: logging.LogRecord) -> bool:
        shown = self._shown(record)
        try:
            msg = record.msg if isinstance(record.msg, str) else ""
            if msg.startswith("torch._dynamo hit config.") and record.args:
                a = record.args
                self.limit = (a[0], a[1], a[3] if len(a) > 3 else None)
                return shown
            if record.funcName != "__call__" or not record.exc_info:
                return shown
            exc = record.exc_info[1]
            limit, self.limit = self.limit, None
            if getattr(exc, "gb_type", None) in NEVER_COMPILED:
                return shown
            owner = _memslim_owner()
            if owner is None:
                return shown
            code = _converting_code()
            cause = _cause(exc, limit)
            where = _where(code) if code is not None else "a frame"
            if getattr(exc, "gb_type", None) == "Dynamo recompile limit exceeded" and code:
                _LIMITED[code] = cause
        except Exception:  # noqa: BLE001  (counting must never stop the user's training)
            return shown
        graphs = owner[2]
        text = f"Dynamo gave up on {where}: it runs eager ({cause})"
        if strict_for(graphs):
            raise FallbackError(f"memslim (strict): {text}") from exc
        graphs.add(f"eager frame: {where}", [note(PASS, text)])
        return shown


def watch() -> None:
    """The filter on torch._dynamo.convert_frame (once per process)."""
    if _INSTALLED:
        return
    logger = logging.getLogger(_LOGGER)
    f = _Watch(logger)
    logger.addFilter(f)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)  # the suppressed exception is logged at INFO
    _INSTALLED.append(f)


def frames_given_up(obj, graphs) -> List[Tuple[str, List[Decision]]]:
    """Graphs to add to obj's report: its root code, given up at Dynamo's recompile limit
    while compiling for another object, with no cached graph of obj's backend (so obj's
    calls run it eager, and Dynamo said nothing when they did). Empty otherwise."""
    from . import compiled

    how = compiled.compiled_with(obj)
    if how is None or how[2] is None or how[2] not in _LIMITED:
        return []
    code = how[2]
    where = _where(code)
    if graphs is not None and any(n == f"eager frame: {where}" for n, _ in graphs.graphs):
        return []
    try:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        entries = _debug_get_cache_entry_list(code)
    except Exception:  # noqa: BLE001
        return []
    if any(compiled._innermost_backend(e.backend) is how[0] for e in entries):
        return []
    text = (
        f"Dynamo gave up on {where} (for another object: {_LIMITED[code]}) before compiling "
        "it for this one: this object's calls of it run eager"
    )
    return [(f"eager frame: {where}", [note(PASS, text)])]
