"""Locating and loading the memslim runtime library, and its fake kernels."""

from __future__ import annotations

import ctypes
import json
import math
import os
from pathlib import Path

import torch

_LOADED = False
_TABLE = None
_LIB_NAME = "libmemslim_runtime.so"


_PACKAGE = Path(__file__).resolve().parent


def build_dir() -> Path:
    """A source checkout's CMake build tree: $MEMSLIM_BUILD_DIR, else <checkout>/build."""
    env = os.environ.get("MEMSLIM_BUILD_DIR")
    return Path(env) if env else _PACKAGE.parent.parent / "build"


def package_path(path: list) -> list:
    """The package's __path__ plus, in a source checkout, the build tree's copy of it
    (build/python/memslim holds _C*.so: the build writes nothing into the sources).
    Installed (pip install .), _C sits in the package itself."""
    extra = build_dir() / "python" / "memslim"
    if not any(_PACKAGE.glob("_C*.so")) and extra.is_dir():
        path.append(str(extra))
    return path


def library_path() -> Path:
    """The runtime library: $MEMSLIM_LIBRARY, else the package's lib/ (installed), else
    the build tree's lib/ (a source checkout)."""
    env = os.environ.get("MEMSLIM_LIBRARY")
    if env:
        return Path(env)
    installed = _PACKAGE / "lib" / _LIB_NAME
    if installed.is_file():
        return installed
    return build_dir() / "lib" / _LIB_NAME


def activation_table() -> dict:
    """memslim's activation table (kernels/include/memslim/kernels/activation_table.def),
    as the runtime library holds it: {"kernels": [{name, save, params, param_names,
    x_min}], "ops": [{name, kernel, aten_keeps, inplace_keeps, added_work}]}. x_min: a non-monotonic activation's minimum, else None."""
    global _TABLE
    if _TABLE is None:
        load_library()
        fn = ctypes.CDLL(str(library_path())).memslim_activation_table_json
        fn.restype = ctypes.c_char_p
        _TABLE = json.loads(fn().decode())
    return _TABLE


def load_library() -> None:
    global _LOADED
    if _LOADED:
        return
    path = library_path()
    if not path.is_file():
        raise ImportError(
            f"memslim: runtime library not found at {path}; build it first "
            "(scripts/setup.sh) or set MEMSLIM_LIBRARY"
        )
    torch.ops.load_library(str(path))
    _register_fakes()
    _LOADED = True


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def _ignorable_in_dynamo(size) -> None:
    # Dynamo propagates fake tensors through the public op (memslim::gelu),
    # whose C++ autograd kernel calls activation_forward internally: the exact
    # list's size symbol is created but not returned by the public op, which
    # Dynamo would report as a pending unbacked symbol. AOTAutograd later
    # traces activation_forward as its own node, where the symbol is bound.
    # Same pattern as torch.distributed's device_mesh ops.
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        in_dynamo = InstructionTranslator.current_tx() is not None
    except (ImportError, AttributeError):
        in_dynamo = False
    if in_dynamo and isinstance(size, torch.SymInt):
        size.node.shape_env.ignorable_fresh_unbacked_symbols.append(size.node._expr)


def _register_fakes() -> None:
    # activation_forward returns an exact list whose length depends on the data;
    # under FakeTensorMode (torch.compile, torch.export) that length is an
    # unbacked symbolic size. The C++ library deliberately has no Meta kernel
    # for this op, so this fake impl is the one tracing uses.
    @torch.library.register_fake("memslim::activation_forward")
    def _(self, act, params, save):
        from . import _C  # the C++ rule for what the forward keeps (loaded by now)

        out = torch.empty_like(self)
        n = self.numel()
        out_max = torch.finfo(self.dtype).max if self.dtype.is_floating_point else math.inf
        uses_bits, has_list = _C.activation_saves(act, list(params), out_max)
        bits = self.new_empty(((n + 7) // 8 if save and uses_bits else 0,), dtype=torch.uint8)
        if save and has_list and _is_fake(self):
            k = torch.library.get_ctx().new_dynamic_size()
            _ignorable_in_dynamo(k)
        else:
            # Plain meta tensors carry no data and no ShapeEnv: the list is
            # modelled as empty (the meta backward kernel never reads it).
            k = 0
        idx = self.new_empty((k,), dtype=torch.int32)
        val = self.new_empty((k,))
        return out, bits, idx, val

    # norm_fallback returns the channels whose gamma cannot be inverted and their
    # x_hat slice: a data-dependent count, the same unbacked size.
    @torch.library.register_fake("memslim::norm_fallback")
    def _(input, mean, rstd, weight, bias, norm, normalized_dims, groups, out_dtype):
        shape = list(input.shape)
        trailing = norm in ("layer_norm", "rms_norm")  # else: channels, dim 1
        first, count = (len(shape) - normalized_dims, normalized_dims) if trailing else (1, 1)
        a, s = math.prod(shape[:first]), math.prod(shape[first + count :])
        opmath = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
        if weight is not None and _is_fake(input):
            k = torch.library.get_ctx().new_dynamic_size()
            _ignorable_in_dynamo(k)
        else:
            k = 0
        return (input.new_empty((k,), dtype=torch.int32), input.new_empty((a, k, s), dtype=opmath))
