"""The CUDA activation kernels' machine code (SASS), read with cuobjdump: no GPU needed.

What: disassembles the runtime library's CUDA kernels and checks two things the CPU tests
of the shared bodies cannot see: every forward kernel does at most one atomic per round of
its grid-stride loop (the exact list's slots are reserved once per warp-converged round,
not once per element), and no forward or backward kernel keeps its values in local memory
(STL / LDL: a Group8 indexed with a loop-dependent index left the registers).
Why: the first GPU run (2026-11-30, H200) measured the A ops (gelu, gelu_tanh, silu, mish,
hardswish) at 2.5x (fp32) and 5.6x (bf16) aten's time; one cause was an atomicAdd on one
global counter for every exact-list element (8 per warp per 256 elements after nvcc's
own warp aggregation), the bf16 kernels also staged groups through local memory.
Skipped where the library has no CUDA code or no cuobjdump is found (CUDA's bin/, PATH,
or the copy triton ships).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest


def _cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    for cand in (
        Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "cuobjdump",
        Path("/usr/local/cuda/bin/cuobjdump"),
    ):
        if cand.is_file():
            return str(cand)
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if cand.is_file():
            return str(cand)
    except ImportError:
        pass
    return None


def kernel_ops(binary: str, tool: str) -> dict:
    """{kernel name: [opcode, ...]} of every CUDA function in `binary` (an object file or a
    shared library), opcodes without their modifiers (ATOMG.E.ADD.64 -> ATOMG)."""
    out = subprocess.run([tool, "-sass", binary], capture_output=True, text=True, timeout=600)
    kernels: dict = {}
    current = None
    for line in out.stdout.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = kernels.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m and current is not None:
            current.append(m.group(1))
    return kernels


def sass_problems(binary: str, tool: str) -> list:
    """Forward kernels with more than one atomic, and forward / backward kernels with local
    memory accesses; [] when there are none (raises when `binary` holds no such kernel)."""
    kernels = kernel_ops(binary, tool)
    checked = 0
    problems = []
    for name, ops in kernels.items():
        fwd, bwd = "forward_kernel" in name, "backward_kernel" in name
        if not (fwd or bwd):
            continue
        checked += 1
        atomics = sum(op in ("ATOMG", "ATOM", "RED", "REDG") for op in ops)
        local = sum(op in ("STL", "LDL") for op in ops)
        if fwd and atomics > 1:
            problems.append(f"{name}: {atomics} atomics")
        if local:
            problems.append(f"{name}: {local} local-memory accesses")
    assert checked, f"no forward/backward kernels in {binary}"
    return problems


def test_forward_reserves_once_and_no_local_memory():
    from memslim._library import library_path

    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    lib = library_path()
    if not lib.is_file():
        pytest.skip(f"no library at {lib}")
    listing = subprocess.run([tool, "-lelf", str(lib)], capture_output=True, text=True, timeout=60)
    if ".cubin" not in listing.stdout:
        pytest.skip("the library has no CUDA code (a CPU-only build)")
    problems = sass_problems(str(lib), tool)
    assert not problems, f"{len(problems)} kernels: " + "; ".join(problems[:8])
