"""memslim-opt over a saved TorchScript archive: rewrite, reload in a new process, train, match."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import memslim

ROOT = Path(__file__).resolve().parents[2]
OPT = os.environ.get("MEMSLIM_OPT", str(ROOT / "build" / "bin" / "memslim-opt"))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 4)

    def forward(self, x):
        h = self.b(F.gelu(self.a(x)))
        return self.c(h * torch.sigmoid(h))

    @torch.jit.export
    def features(self, x):
        return F.gelu(self.a(x))


TRAIN = r"""
import json, sys, torch, warnings
warnings.filterwarnings("ignore")
import memslim
m = torch.jit.load(sys.argv[1])
torch.manual_seed(0)
opt = torch.optim.SGD(m.parameters(), lr=0.05)
losses = []
for _ in range(3):
    x = torch.randn(8, 16)
    opt.zero_grad()
    loss = m(x).pow(2).mean()
    loss.backward()
    opt.step()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "graph": str(m.graph), "saved": memslim.saved_bytes(m, torch.randn(8, 16))}))
"""


def run_train(path):
    out = subprocess.run([sys.executable, "-c", TRAIN, str(path)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pt_round_trip_trains_identically(tmp_path):
    torch.manual_seed(0)
    src, dst = tmp_path / "net.pt", tmp_path / "net_opt.pt"
    torch.jit.save(torch.jit.script(Net()), str(src))
    r = subprocess.run([OPT, str(src), "--pipeline=memslim-default", "--input-shapes=8x16",
                        "--verify", "--remarks", "-o", str(dst)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "canonicalize-activations: x * sigmoid(x)" in r.stderr
    assert "rewrote aten::gelu" in r.stderr and "rewrote aten::silu" in r.stderr
    assert "verify: ok" in r.stderr
    before, after = run_train(src), run_train(dst)
    assert "memslim::gelu" in after["graph"] and "memslim::silu" in after["graph"]
    for a, b in zip(before["losses"], after["losses"]):
        assert abs(a - b) <= 1e-5 * abs(a)
    assert after["saved"] < before["saved"]
    # Every method was rewritten, not only forward (no shapes there: priced as unknown).
    assert "output-saving-activations: kept aten::gelu" in r.stderr and "unknown shape" in r.stderr


def test_pt_errors_leave_no_output(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    out = tmp_path / "out.pt"
    r = subprocess.run([OPT, str(bad), "--passes=cleanup", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.startswith("memslim-opt: error: cannot load") and r.stderr.count("\n") == 1
    assert not out.exists()
