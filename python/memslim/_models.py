"""Model builders shared by tests and bench/ (torchvision / transformers code, random weights)."""
from __future__ import annotations

import torch


def swap_relu_for_gelu(module: torch.nn.Module) -> torch.nn.Module:
    """Replaces every nn.ReLU in `module` (recursively, in place) by nn.GELU."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.ReLU):
            setattr(module, name, torch.nn.GELU())
        else:
            swap_relu_for_gelu(child)
    return module


def gelu_resnet(arch: str, seed: int = 0) -> torch.nn.Module:
    """torchvision `arch` (resnet18, resnet50, ...) with every ReLU swapped for GELU."""
    import torchvision

    torch.manual_seed(seed)
    return swap_relu_for_gelu(getattr(torchvision.models, arch)())
