"""memslim: make PyTorch training keep less memory for backward.

Importing memslim loads the runtime library, which registers the
``torch.ops.memslim.*`` activation ops (aten signatures; autograd keeps the
output plus packed bits, or only a mask, instead of the input).
"""
from __future__ import annotations

from ._library import activation_table, library_path, load_library
from .measure import saved_bytes

load_library()

from .optimize import optimize, predicted_bytes_freed, report  # noqa: E402  (needs the runtime loaded first)

__all__ = ["activation_table", "library_path", "saved_bytes", "optimize", "predicted_bytes_freed",
           "report", "OPS"]

# Public ops with their aten counterparts (the rewrite targets), from the one table.
OPS = tuple(op["name"] for op in activation_table()["ops"])
