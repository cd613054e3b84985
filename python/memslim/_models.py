"""Model builders shared by tests and bench/ (torchvision / transformers code, random weights)."""
from __future__ import annotations

from typing import Callable, Type

import torch

# The seed-000 activation's order range (../shared/seeds/000-forum-custom-activation-memory.txt).
MIN_FRAC_ORDER = 0.1
MAX_FRAC_ORDER = 1.9


class FracAct(torch.nn.Module):
    """A trainable fractional-order activation built on the seed-000 formula.

    Positive branch: lambda * x^(1-a) / Gamma(2-a); negative branch: a three-term
    Gruenwald-style sum of (1 - exp(x - n h)) Gamma(1+a) / (n! Gamma(1-n+a)) (-1)^n,
    scaled by alpha * lambda / h^a; the order a = sigmoid(order) squeezed into
    [0.1, 1.9] is a trainable 0-dim parameter. Gamma is exp(lgamma(.)), as the
    seed does for arguments above its threshold (no control flow, so it scripts
    to one straight-line pointwise region). Every intermediate is a full-size
    tensor that eager autograd keeps: the point of the seed.
    """

    __constants__ = ["alpha", "lam", "h"]

    def __init__(self, alpha: float = 1.6732, lam: float = 1.0507, h: float = 1.0, init: float = 0.3):
        super().__init__()
        self.alpha, self.lam, self.h = alpha, lam, h
        # init 0.3 keeps every Gamma argument away from the poles (1-2+a = 0.13).
        self.order = torch.nn.Parameter(torch.tensor(float(init)))
        self.register_buffer("gamma_consts", torch.tensor([1.0, 1.0, 2.0]), persistent=False)
        self.register_buffer("n_consts", torch.tensor([0.0, 1.0, 2.0]), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.sigmoid(self.order) * 1.8 + 0.1  # [MIN_FRAC_ORDER, MAX_FRAC_ORDER]
        pos = torch.where(x > 0, x, 1.0)
        pos = self.lam * torch.pow(pos, 1 - a) / torch.exp(torch.lgamma(2 - a))
        neg = torch.where(x <= 0, x, 1.0)
        g1a = torch.exp(torch.lgamma(1 + a))
        n = self.n_consts[0]
        top = (1 - torch.exp(neg - n * self.h)) * g1a
        acc = top / (self.gamma_consts[0] * torch.exp(torch.lgamma(1 - n + a))) * torch.pow(-1, n)
        n = self.n_consts[1]
        top = (1 - torch.exp(neg - n * self.h)) * g1a
        acc = acc + top / (self.gamma_consts[1] * torch.exp(torch.lgamma(1 - n + a))) * torch.pow(-1, n)
        n = self.n_consts[2]
        top = (1 - torch.exp(neg - n * self.h)) * g1a
        acc = acc + top / (self.gamma_consts[2] * torch.exp(torch.lgamma(1 - n + a))) * torch.pow(-1, n)
        neg = self.alpha * self.lam / torch.pow(self.h, a) * acc
        return torch.where(x > 0, pos, neg)


def swap_activation(module: torch.nn.Module, old: Type[torch.nn.Module],
                    factory: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """Replaces every `old` module in `module` (recursively, in place) by factory()."""
    for name, child in module.named_children():
        if isinstance(child, old):
            setattr(module, name, factory())
        else:
            swap_activation(child, old, factory)
    return module


def swap_relu_for_gelu(module: torch.nn.Module) -> torch.nn.Module:
    """Replaces every nn.ReLU in `module` (recursively, in place) by nn.GELU."""
    return swap_activation(module, torch.nn.ReLU, torch.nn.GELU)


def gelu_resnet(arch: str, seed: int = 0) -> torch.nn.Module:
    """torchvision `arch` (resnet18, resnet50, ...) with every ReLU swapped for GELU."""
    import torchvision

    torch.manual_seed(seed)
    return swap_relu_for_gelu(getattr(torchvision.models, arch)())


def torchvision_with(arch: str, act: str, seed: int = 0) -> torch.nn.Module:
    """torchvision `arch` with its activation (ReLU in ResNets, SiLU in EfficientNets)
    swapped for `act`: "relu" / "silu" (unchanged), "gelu", or "frac" (FracAct)."""
    import torchvision

    torch.manual_seed(seed)
    model = getattr(torchvision.models, arch)()
    old = torch.nn.SiLU if arch.startswith("efficientnet") else torch.nn.ReLU
    factory = {"gelu": torch.nn.GELU, "frac": FracAct}.get(act)
    return swap_activation(model, old, factory) if factory else model
