"""memslim: make PyTorch training keep less memory for backward.

Importing memslim loads the runtime library, which registers the
``torch.ops.memslim.*`` activation ops (aten signatures; autograd keeps the
output plus packed bits, or only a mask, instead of the input).
"""

from __future__ import annotations

from ._library import activation_table, library_path, load_library, package_path

__path__ = package_path(__path__)  # noqa: F821  (a source checkout's build/python/memslim)
from .measure import saved_bytes

load_library()

from . import fx  # noqa: E402  (needs the runtime loaded first)
from .backend import compile, compiled_decisions  # noqa: E402
from .backend import _register as _register_backend  # noqa: E402
from .optimize import optimize  # noqa: E402
from .records import Records, report  # noqa: E402
from .summary import summary  # noqa: E402

__all__ = [
    "activation_table",
    "library_path",
    "saved_bytes",
    "optimize",
    "compile",
    "fx",
    "predicted_bytes_freed",
    "report",
    "summary",
    "Records",
    "compiled_decisions",
    "OPS",
]

# torch.compile(model, backend="memslim")
_register_backend()


def predicted_bytes_freed(optimized) -> int:
    """The cost model's total: the bytes every applied rewrite's record frees."""
    return sum(
        d.freed_bytes
        for d in report(optimized)
        if d.verdict == "rewrote" and d.freed_bytes is not None
    )


# Public ops with their aten counterparts (the rewrite targets), from the one table.
OPS = tuple(op["name"] for op in activation_table()["ops"])
