"""The ops inside TorchScript and under torch.compile(fullgraph=True)."""

import pytest
import torch
import torch.nn.functional as F

import memslim

M = torch.ops.memslim


class Block(torch.nn.Module):
    def __init__(self, use_memslim: bool):
        super().__init__()
        self.use_memslim = use_memslim
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 8)

    def forward(self, x):
        h = self.a(x)
        if self.use_memslim:
            h = torch.ops.memslim.gelu(h, "none")
            h = torch.ops.memslim.silu(self.b(h))
            h = torch.ops.memslim.leaky_relu(h, 0.1)
        else:
            h = F.gelu(h)
            h = F.silu(self.b(h))
            h = F.leaky_relu(h, 0.1)
        return self.c(h)


def _pair():
    torch.manual_seed(0)
    ref = Block(False)
    ours = Block(True)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _train(model, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {
        k.replace("_orig_mod.", ""): p.grad.clone() for k, p in model.named_parameters()
    }


def _assert_same(a, b):
    la, ga = a
    lb, gb = b
    assert la == pytest.approx(lb, rel=1e-5)
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=1e-4, atol=1e-5, msg=k)


def test_scripted_module_trains_like_aten():
    ref, ours = _pair()
    scripted = torch.jit.script(ours)
    assert "memslim::gelu" in str(scripted.graph)
    _assert_same(_train(scripted), _train(ref))


def test_scripted_module_saves_less():
    ref, ours = _pair()
    x = torch.randn(16, 32)
    assert memslim.saved_bytes(torch.jit.script(ours), x) < memslim.saved_bytes(
        torch.jit.script(ref), x
    )


def test_scripted_module_save_load(tmp_path):
    _, ours = _pair()
    path = tmp_path / "block.pt"
    torch.jit.save(torch.jit.script(ours), str(path))
    loaded = torch.jit.load(str(path))
    x = torch.randn(4, 32)
    torch.testing.assert_close(loaded(x), ours(x))


def test_torch_compile_fullgraph_matches_eager():
    ref, ours = _pair()
    compiled = torch.compile(ours, fullgraph=True, dynamic=False)
    _assert_same(_train(compiled), _train(ref))


def test_torch_compile_traces_the_saving_ops():
    # The joint graph holds memslim's forward/backward ops, so the compiled
    # backward uses the output + bits, not the input.
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    backend = AotEagerAndRecordGraphs()
    _, ours = _pair()
    f = torch.compile(ours, backend=backend, fullgraph=True, dynamic=False)
    f(torch.randn(4, 32)).sum().backward()
    fw = "\n".join(g.code for g in backend.fw_graphs)
    bw = "\n".join(g.code for g in backend.bw_graphs)
    assert "memslim.activation_forward" in fw
    assert "memslim.activation_backward" in bw
