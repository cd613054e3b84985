"""`pip install --no-build-isolation .` builds and installs a working memslim (issue 10):
the package, its libraries, memslim-opt and the torch.compile backend's entry point, run
from the installed copy alone (PYTHONPATH is the install target, not the sources).
Its own ctest (pip_install): a wheel build takes minutes cold."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SMOKE = r"""
import sys, torch, memslim
from importlib.metadata import entry_points
assert memslim.__file__.startswith(sys.argv[1]), memslim.__file__
assert memslim._C.__file__.startswith(sys.argv[1]), memslim._C.__file__
assert str(memslim.library_path()).startswith(sys.argv[1]), memslim.library_path()
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
torch.compile(m, backend="memslim")(torch.randn(4, 8)).sum().backward()
assert any(d.verdict == "rewrote" for d in memslim.compiled_decisions())
eps = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "memslim"]
assert eps and eps[0].load() is memslim.backend.backend
torch.export.save(torch.export.export(m, (torch.randn(4, 8),)), sys.argv[2])
print("ok")
"""


def test_pip_install_target(tmp_path):
    target = tmp_path / "site"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-build-isolation",
            "--no-deps",
            "--target",
            str(target),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert (target / "bin" / "memslim-opt").is_file()
    assert not list((ROOT / "python" / "memslim").glob("_C*.so")), (
        "the build wrote into the sources"
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("MEMSLIM_BUILD_DIR", None)
    env.pop("MEMSLIM_LIBRARY", None)
    pt2 = tmp_path / "m.pt2"
    r = subprocess.run(
        [sys.executable, "-c", SMOKE, str(target), str(pt2)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
    r = subprocess.run(
        [str(target / "bin" / "memslim-opt"), str(pt2), "-o", str(tmp_path / "o.pt2"), "--remarks"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0 and "fused aten::gelu" in r.stderr, r.stderr[-3000:]
