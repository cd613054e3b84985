"""memslim ops demo: a small model using each op, eager aten vs memslim ops.

For every activation: an MLP block Linear(512, 1024) -> act -> Linear(1024, 512)
on a batch of 256, run once with the aten activation and once with the
torch.ops.memslim op (same weights). Prints saved-for-backward bytes of each
(memslim.saved_bytes: distinct storages autograd keeps, parameters excluded)
and the largest gradient difference over the input and all parameters,
relative to the largest gradient magnitude.
"""

import sys

import torch

import memslim
from memslim import _numerics as N

# (name, aten function, memslim op) for each op with default arguments.
ACTS = [
    (name, N.CASES[name].aten, N.CASES[name].ours)
    for name in (
        "gelu",
        "gelu_tanh",
        "silu",
        "mish",
        "softplus",
        "elu",
        "celu",
        "selu",
        "leaky_relu",
        "hardswish",
        "hardsigmoid",
        "sigmoid",
        "tanh",
        "relu",
    )
]


class Block(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.up = torch.nn.Linear(512, 1024)
        self.down = torch.nn.Linear(1024, 512)
        self.act = act

    def forward(self, x):
        return self.down(self.act(self.up(x)))


def grads(model, x):
    x = x.clone().requires_grad_(True)
    model.zero_grad()
    model(x).pow(2).mean().backward()
    return [x.grad] + [p.grad for p in model.parameters()]


def main() -> int:
    torch.manual_seed(0)
    x = torch.randn(256, 512)
    print(
        f"torch {torch.__version__}; block Linear(512,1024) -> act -> Linear(1024,512), batch 256, fp32"
    )
    print(
        f"{'activation':<12} {'eager saved':>12} {'memslim saved':>14} {'change':>8} {'max grad diff':>14}"
    )
    worst = 0.0
    for name, aten, ours in ACTS:
        ref = Block(aten)
        opt = Block(ours)
        opt.load_state_dict(ref.state_dict())
        b_ref = memslim.saved_bytes(ref, x.clone().requires_grad_(True))
        b_opt = memslim.saved_bytes(opt, x.clone().requires_grad_(True))
        g_ref, g_opt = grads(ref, x), grads(opt, x)
        scale = max(g.abs().max().item() for g in g_ref)
        diff = max((a - b).abs().max().item() for a, b in zip(g_ref, g_opt)) / scale
        worst = max(worst, diff)
        print(
            f"{name:<12} {b_ref:>12,} {b_opt:>14,} {100.0 * (b_opt - b_ref) / b_ref:>7.1f}% {diff:>14.2e}"
        )
    print(f"worst relative gradient difference: {worst:.2e}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
