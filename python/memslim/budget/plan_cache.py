"""The budget planner's plans on disk: a second process plans a graph without dry runs.

What: `lookup` / `store` of one graph's plans, a JSON file per graph under
<Inductor's cache dir>/memslim-plans (MEMSLIM_PLAN_CACHE_DIR to move it,
MEMSLIM_PLAN_CACHE=0 to turn it off). The file's name is a hash of what the plan depends
on: the graph as make_fx traced it (its code and every placeholder's shape, stride and
dtype), the parameters' positions, the policy, torch's version and memslim's own
(its Python files and its C++ library, by content and size). It holds the
unmodified partition's bytes ("before", which the target is computed from; "profile",
its live peaks for peak_memory='s predictor) and, per
budget and target, the way the planner took (budget/ladder.py `_replay`), the bytes that
plan keeps, its notes, or the error of a target no plan meets.
Beside the plans, `load_graph` / `store_graph` keep the aten graph make_fx traced from
Dynamo's (torch.fx's GraphPickler, node values included), keyed by Dynamo's graph
(`graph_key`): a second process replays its plan without tracing again.
Why: every figure the planner decides by is a dry-run partition (seconds each on a real
model; issue 48 measured 37-160 s to the first step against torch.compile's 8-16 s with
the same budget). A plan depends only on the graph and the figures above, so a replay
is exact: the same tags and partitioner options, the same notes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import torch

from .. import fx

VERSION = 2  # of the file's layout (2: the partitions' profiles)


def _dir() -> Optional[Path]:
    if os.environ.get("MEMSLIM_PLAN_CACHE", "1") == "0":
        return None
    where = os.environ.get("MEMSLIM_PLAN_CACHE_DIR")
    if not where:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        where = os.path.join(cache_dir(), "memslim-plans")
    return Path(where)


@functools.lru_cache(maxsize=1)
def _memslim_version() -> str:
    """memslim's Python files and the C++ library, by content (a rebuild or an edit gives
    other plans and traces a new key: a trace reads the ops' fake kernels, _library.py)."""
    from .. import _C

    h = hashlib.sha256()
    package = Path(__file__).parent.parent
    for f in sorted(package.rglob("*.py")):
        h.update(f.read_bytes())
    lib = Path(getattr(_C, "__file__", "") or "")
    if lib.is_file():
        st = lib.stat()
        h.update(f"{lib.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def key(aten: torch.fx.GraphModule, skip, policy: dict) -> Optional[str]:
    """The hash of what a plan of `aten` depends on (see the module's docstring); None
    where the cache is off. The graph's code is generated, not compiled (a lazy
    GraphModule's `.code` recompiles it, one more source FX keeps for the process)."""
    if _dir() is None:
        return None
    h = hashlib.sha256()
    h.update(f"{VERSION}|{torch.__version__}|{_memslim_version()}".encode())
    h.update(aten.graph.python_code(root_module="self").src.encode())
    for n in aten.graph.find_nodes(op="placeholder"):
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            h.update(f"{n.name}:{tuple(v.shape)}:{v.stride()}:{v.dtype}:{v.requires_grad}".encode())
        else:
            h.update(f"{n.name}:{v!r}".encode())
    h.update(repr(sorted(skip)).encode())
    h.update(repr(sorted((k, v) for k, v in policy.items() if k != "memory_budget")).encode())
    return h.hexdigest()[:40]


def lookup(k: str) -> Optional[dict]:
    """The graph's entry ({"before": int, "plans": {sub-key: plan}}), or None."""
    d = _dir()
    if d is None:
        return None
    try:
        entry = json.loads((d / f"{k}.json").read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("before"), int) else None


def store(k: str, before: int, sub: str, plan: dict) -> None:
    """Adds `plan` under `sub` to the graph's entry (written whole, atomically). A cache
    that cannot be written is skipped: a plan is never worth a failed step."""
    d = _dir()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        fresh = {"before": int(before), "plans": {}}
        if hasattr(before, "profile"):  # budget.measure.Partition: the predictor's figures
            fresh["profile"] = before.profile()
        entry = lookup(k) or fresh
        if entry.get("before") != before:
            entry = fresh
        entry["plans"][sub] = plan
        tmp = d / f"{k}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, d / f"{k}.json")
    except OSError:
        pass


def sub_key(budget, target: int) -> str:
    return f"{budget!r}:{target}"


def model_key(budget, first_graph: str) -> str:
    """A model's key: its budget and its first graph's key (the graphs after it follow
    from the same code)."""
    return "model-" + hashlib.sha256(f"{budget!r}|{first_graph}".encode()).hexdigest()[:40]


def lookup_model(k: str) -> Optional[dict]:
    """A model's shares ({slot: bytes}, slots as JSON lists), or None."""
    d = _dir()
    if d is None:
        return None
    try:
        shares = json.loads((d / f"{k}.json").read_text()).get("shares")
    except (OSError, ValueError, AttributeError):
        return None
    return shares if isinstance(shares, list) else None


def store_model(k: str, shares: list) -> None:
    """Keeps a settled model's shares ([[slot, bytes], ...]): a second process plans
    its first forward with them, where it would re-plan otherwise."""
    d = _dir()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{k}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"shares": shares}))
        os.replace(tmp, d / f"{k}.json")
    except OSError:
        pass


def graph_key(gm: torch.fx.GraphModule, fakes) -> Optional[str]:
    """graph_key's hash, None where anything in it cannot be read (a cache never fails a
    step)."""
    try:
        return _graph_key(gm, fakes)
    except Exception:  # noqa: BLE001
        return None


def _graph_key(gm: torch.fx.GraphModule, fakes) -> Optional[str]:
    """The hash of what make_fx's trace of Dynamo's graph `gm` depends on: its code, every
    input's metadata, the grad and autocast modes, torch's and memslim's versions. None
    where the cache is off or the trace may depend on more: a submodule call (its code is
    not in the graph's), a constant that is not a small CPU tensor (its value is part of
    the key) or a symbolic size (a dynamic graph's symbols are the process's)."""
    if _dir() is None:
        return None
    if any(n.op == "call_module" for n in gm.graph.nodes):
        return None
    h = hashlib.sha256()
    h.update(f"graph|{VERSION}|{torch.__version__}|{_memslim_version()}".encode())
    h.update(
        f"{torch.is_grad_enabled()}|{torch.is_autocast_enabled('cpu')}|"
        f"{torch.get_default_dtype()}".encode()
    )
    h.update(gm.graph.python_code(root_module="self").src.encode())
    for n in gm.graph.find_nodes(op="get_attr"):  # constants: their values, not in the code
        v = _attr(gm, n.target)
        if not isinstance(v, torch.Tensor) or v.device.type != "cpu" or v.numel() > 1 << 20:
            return None
        h.update(f"{n.target}:{v.dtype}:{tuple(v.shape)}".encode())
        h.update(v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for v in fakes:
        if isinstance(v, torch.Tensor):
            dims = (*v.shape, *v.stride(), v.storage_offset())
            if not all(isinstance(d, int) for d in dims):
                return None
            h.update(
                f"{dims}:{v.dtype}:{v.device}:{v.requires_grad}:"
                f"{isinstance(v, torch.nn.Parameter)}".encode()
            )
        elif isinstance(v, (int, float, bool, str, type(None))):
            h.update(f"{type(v).__name__}:{v!r}".encode())
        else:
            return None
    return "aten-" + h.hexdigest()[:40]


def load_graph(k: str, fake_mode) -> Optional[torch.fx.GraphModule]:
    """The aten graph stored under `k`, its values faked in `fake_mode`; None where there
    is none or it does not load (a cache never fails a step)."""
    from torch.fx._graph_pickler import GraphPickler

    d = _dir()
    try:
        return GraphPickler.loads((d / f"{k}.pkl").read_bytes(), fake_mode)
    except Exception:  # noqa: BLE001  (a missing or stale entry: trace again)
        return None


def store_graph(k: str, aten: torch.fx.GraphModule) -> None:
    """Keeps `aten` (without the ShapeEnv make_fx leaves on it) under `k`, where every
    value in it has static sizes."""
    from torch.fx._graph_pickler import GraphPickler, Options

    d = _dir()
    if not all(_static(n.meta.get("val")) for n in aten.graph.nodes):
        return  # a data-dependent size: its symbol is the process's ShapeEnv's
    env = aten.__dict__.get("shape_env")
    try:
        aten.shape_env = None
        data = GraphPickler.dumps(aten, Options(ops_filter=None))
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{k}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, d / f"{k}.pkl")
    except Exception:  # noqa: BLE001  (what GraphPickler cannot pickle is traced each time)
        pass
    finally:
        aten.shape_env = env


def _static(val) -> bool:
    if isinstance(val, (list, tuple)):
        return all(_static(v) for v in val)
    if isinstance(val, torch.Tensor):
        return fx._static_tensor(val)
    return not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _attr(gm: torch.fx.GraphModule, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj
