"""The budget planner's plans on disk: a second process plans a graph without dry runs.

What: `lookup` / `store` of one graph's plans, a JSON file per graph under
<Inductor's cache dir>/memslim-plans (MEMSLIM_PLAN_CACHE_DIR to move it,
MEMSLIM_PLAN_CACHE=0 to turn it off). The file's name is a hash of what the plan depends
on: the graph as make_fx traced it (its code and every placeholder's shape, stride and
dtype), the parameters' positions, the policy, torch's version and memslim's own
(its planner's Python files and its C++ library, by content and size). It holds the
unmodified partition's bytes ("before", which the target is computed from; "profile",
its live peaks for peak_memory='s predictor) and, per
budget and target, the way the planner took (budget/ladder.py `_replay`), the bytes that
plan keeps, its notes, or the error of a target no plan meets.
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
    """The planner's Python files and the C++ library, by content (a rebuild or an edit
    gives other plans a new key)."""
    from .. import _C

    h = hashlib.sha256()
    here = Path(__file__).parent
    for f in sorted(here.glob("*.py")) + [here.parent / "backend.py", here.parent / "fx.py"]:
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
