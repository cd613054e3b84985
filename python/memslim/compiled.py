"""Which object a torch.compile graph belongs to: memslim.report for compiled models.

What: while the backend compiles a graph, `graph_records(into)` finds what torch.compile
made whose call is being compiled (the OptimizedModule, a module's own `.compile()`, or a
compiled function: the Dynamo entry frame `compile_wrapper` on the Python stack, read
through its closure), names the graph (Dynamo's compile id "frame/recompile", the code it
traced, where a graph break ends it) and returns the list its records go to, kept in the
one store (records.py) under that object and its original module. `graphs_of(x)` answers
for torch.compile's wrappers (a compiled function, an OptimizedModule whose original
module is known), for a model whose blocks were compiled or optimized one by one
(`graphs_of_parts`), and for the graphs Dynamo's cache shares: its cache is per code object
and backend, so a second model of the same class compiled with backend="memslim" runs the
first one's graphs without a compile; those graphs are listed for it as "shared".
Why the stack: the backend is one function for every model (torch.compile looks
"memslim" up by name), Dynamo hands it no owner, and only the wrappers' frames know it.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import torch

from . import records as store
from .records import Decision, Graphs


def _eval_frame_file() -> str:
    import torch._dynamo.eval_frame as ef

    return ef.__file__.rsplit(".", 1)[0]


def _owner_on_stack(with_context: bool = False):
    """(owner, original module or None, the function Dynamo compiles) of the innermost
    torch.compile wrapper running now, or None outside one; with_context: and the
    wrapper's Dynamo context (its `callback` leads to the backend)."""
    from torch._dynamo.eval_frame import OptimizedModule

    where = _eval_frame_file()
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        if code.co_name == "compile_wrapper" and code.co_filename.rsplit(".", 1)[0] == where:
            local = f.f_locals
            ctx, fn = local.get("self"), local.get("fn")
            extra = (ctx,) if with_context else ()
            g = f.f_back
            # OptimizedModule.__call__ -> _call_impl -> its forward (memslim.compile's:
            # planned's run -> rng_reads.traced's call -> Dynamo's).
            for _ in range(4):
                if g is None:
                    break
                me = g.f_locals.get("self") if "self" in g.f_code.co_varnames else None
                if isinstance(me, OptimizedModule) and me.dynamo_ctx is ctx:
                    return (me, me._orig_mod, fn) + extra
                g = g.f_back
            bound = getattr(fn, "__self__", None)
            if isinstance(bound, torch.nn.Module):  # module.compile(): its _call_impl
                return (bound, None, fn) + extra
            return (fn, None, fn) + extra
        f = f.f_back
    return None


def _innermost_backend(callback):
    """The backend function under Dynamo's wrappers of it (the callback's chain of
    `_torchdynamo_orig_backend`, then torch.compile's `compiler_fn`), or None."""
    seen = 0
    while callback is not None and seen < 16:
        nxt = getattr(callback, "_torchdynamo_orig_backend", None)
        if nxt is None:
            nxt = getattr(callback, "compiler_fn", None)
        if nxt is None:
            return callback
        callback, seen = nxt, seen + 1
    return None


def _share_root(obj, orig):
    """What Dynamo's cache holds `obj`'s graphs under, as far as another object can meet
    it: a module's class (its forward's code; torch.nn's own modules run through one
    wrapper's code), a function's code."""
    target = orig if orig is not None else obj
    if isinstance(target, torch.nn.Module):
        return type(target)
    return getattr(target, "__code__", None)


def _root_code(target):
    """The code Dynamo's first frame for `target` runs: a module's forward, a function."""
    if isinstance(target, torch.nn.Module):
        target = getattr(type(target), "forward", None)
    return getattr(target, "__code__", None)


def _graph_name(gm, fallback: int, owner=None):
    """'graph 0/1: forward at model.py:12' (the compile id: Dynamo's frame / recompile
    count; a torch.nn module's forward, which Dynamo enters through its own wrapper, by
    the module's class), plus where a graph break ends the graph; and the code object
    Dynamo's cache holds it under (None outside Dynamo)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        code = InstructionTranslator.current_tx().f_code
    except Exception:  # noqa: BLE001  (outside Dynamo: a direct call of the backend)
        return f"graph {fallback}", None
    where = f"{code.co_name} at {_short(code.co_filename)}:{code.co_firstlineno}"
    if code.co_filename.endswith("external_utils.py") and isinstance(owner, torch.nn.Module):
        where = f"{type(owner).__name__}.forward"
    name = f"graph {cid}: {where}"
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is not None and str(getattr(reason, "reason", "")).startswith("DDPOptimizer"):
        name += " (a DDP bucket)"  # DDP's optimizer: one graph per gradient bucket
    elif reason is not None and getattr(reason, "graph_break", False) and reason.user_stack:
        at = reason.user_stack[-1]
        name += f" (to a graph break at {_short(at.filename)}:{at.lineno})"
    return name, code


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def graph_records(gm, into: Optional[Graphs], backend) -> List[Decision]:
    """The list a graph's records go to: a new graph of `into` (memslim.compile's model),
    else of what torch.compile made whose call is compiling (found on the stack), else
    of a Graphs of its own (the backend called directly)."""
    try:
        found = _owner_on_stack()
    except Exception:  # noqa: BLE001  (a report must never stop the user's training)
        found = None
    owner, orig, _ = found if found is not None else (None, None, None)
    if into is None and owner is None:
        into = Graphs("the memslim backend called directly")
    elif into is None:
        into = store.lookup(owner)
        if into is None:
            kind = "torch.compile(backend='memslim')"
            into = store.keep(owner, Graphs(kind, (backend, _share_root(owner, orig))))
        if orig is not None and store.lookup(orig) is None:
            store.keep(orig, into)  # report(model) for the module the user kept
    name, code = _graph_name(gm, len(into.graphs), orig if orig is not None else owner)
    if code is not None:
        into.codes.add(code)
    records = into.add(name)
    _LAST_CODE[id(records)] = code
    return records


# The code object Dynamo traced for a graph, by its records list's id (the latest graph
# only: budget.model's slot of the graph being compiled).
_LAST_CODE: dict = {}


def last_code(records):
    """The code object Dynamo traced for the graph whose records are `records`, or None."""
    code = _LAST_CODE.get(id(records))
    _LAST_CODE.clear()
    return code


def compiled_with(obj):
    """(backend, share root, root code) of a torch.compile wrapper `obj`, or None: an
    OptimizedModule, a module after .compile(), a compiled function."""
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(obj, OptimizedModule):
        backend = _innermost_backend(obj.dynamo_ctx.callback)
        return backend, _share_root(obj, obj._orig_mod), _root_code(obj._orig_mod)
    wrapper = getattr(obj, "_compiled_call_impl", None) if isinstance(obj, torch.nn.Module) else obj
    if wrapper is None or getattr(wrapper, "__code__", None) is None:
        return None
    cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or ()))
    if "callback" not in cells or "fn" not in cells:
        return None
    try:
        callback, fn = cells["callback"].cell_contents, cells["fn"].cell_contents
    except ValueError:
        return None
    bound = getattr(fn, "__self__", None)
    return _innermost_backend(callback), _share_root(fn, bound), _root_code(bound or fn)


def _is_memslim(backend) -> bool:
    from .backend import backend as ours

    return backend is ours or getattr(backend, "func", None) is ours


def graphs_of(obj) -> Optional[Graphs]:
    """The Graphs of a torch.compile wrapper memslim's backend compiles for: its own
    (a compiled function's are kept under the function), else the graphs Dynamo's cache
    shares with it (same backend, same code: compiled for another object), else an
    empty Graphs (nothing compiled yet). None when `obj` is no such wrapper."""
    orig = getattr(obj, "_torchdynamo_orig_callable", None)
    if orig is not None and store.lookup(orig) is not None:
        return store.lookup(orig)
    how = compiled_with(obj)
    if how is None or not _is_memslim(how[0]):
        return None
    shared = Graphs("torch.compile(backend='memslim')", how)
    seen = set()
    for other in store.known():  # an owner's Graphs is also its original module's
        key = other.share_key
        if key is None or id(other) in seen or how[1] is None:
            continue
        seen.add(id(other))
        if key[0] is how[0] and (key[1] is how[1] or how[2] in other.codes):
            for name, records in other.graphs:
                shared.add(name + " (shared: compiled for another object)", records)
    return shared


def graphs_of_parts(obj) -> Optional[Graphs]:
    """A module none of the ways in made, whose submodules were (per-block compiles, as
    FSDP2 and torchtitan do, or an optimized block put in a model): their graphs, each
    name prefixed by the submodule's path. None when no submodule has any."""
    if not isinstance(obj, torch.nn.Module):
        return None
    parts = Graphs("its submodules (compiled or optimized)")
    seen = set()
    for path, sub in obj.named_modules():
        found = (store.lookup(sub) or graphs_of(sub)) if path else None
        if found is None or id(found) in seen:
            continue
        seen.add(id(found))
        for name, records in found.graphs:
            parts.add(f"{path}: {name}", records)
    return parts if seen else None


def why_unknown(obj) -> str:
    """A clause for report's error: the backend a torch.compile wrapper was compiled
    with, when it is not memslim's."""
    how = compiled_with(obj)
    if how is None:
        return ""
    name = getattr(how[0], "compiler_name", None) or getattr(how[0], "__name__", repr(how[0]))
    return f" (torch.compile'd with backend {name!r}, not 'memslim')"
