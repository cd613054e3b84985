"""Model builders shared by tests and bench/ (torchvision / transformers code, random weights)."""

from __future__ import annotations

import math
from typing import Callable, Optional, Type

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

    def __init__(
        self, alpha: float = 1.6732, lam: float = 1.0507, h: float = 1.0, init: float = 0.3
    ):
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
        acc = acc + top / (self.gamma_consts[1] * torch.exp(torch.lgamma(1 - n + a))) * torch.pow(
            -1, n
        )
        n = self.n_consts[2]
        top = (1 - torch.exp(neg - n * self.h)) * g1a
        acc = acc + top / (self.gamma_consts[2] * torch.exp(torch.lgamma(1 - n + a))) * torch.pow(
            -1, n
        )
        neg = self.alpha * self.lam / torch.pow(self.h, a) * acc
        return torch.where(x > 0, pos, neg)


def swap_activation(
    module: torch.nn.Module, old: Type[torch.nn.Module], factory: Callable[[], torch.nn.Module]
) -> torch.nn.Module:
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


# --- Reversible models (issue 12): additive couplings y1 = x1 + F(x2), y2 = x2 + G(y1),
# written the way memcnn / revlib users write their blocks, without any memory trick:
# memslim's invertible-couplings pass finds them and keeps only each chain's outputs.


class RevResidualFn(torch.nn.Module):
    """F or G of a RevNet block: BN-ReLU-conv3x3-BN-ReLU-conv3x3 (memcnn's RevNet basic block)."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.bn2(self.conv1(torch.relu(self.bn1(x))))))


class AdditiveCoupling(torch.nn.Module):
    """y1 = x1 + F(x2), y2 = x2 + G(y1) over the two halves of dim `dim`."""

    def __init__(self, f: torch.nn.Module, g: torch.nn.Module, dim: int = 1):
        super().__init__()
        self.f, self.g, self.dim = f, g, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = torch.chunk(x, 2, dim=self.dim)
        y1 = x1 + self.f(x2)
        y2 = x2 + self.g(y1)
        return torch.cat([y1, y2], dim=self.dim)


class AffineResidualFn(torch.nn.Module):
    """F or G of an affine coupling: RevResidualFn's body ending in a conv to twice the
    channels, read as (s, t)."""

    def __init__(self, channels: int):
        super().__init__()
        self.body = RevResidualFn(channels)
        self.bn = torch.nn.BatchNorm2d(channels)
        self.proj = torch.nn.Conv2d(channels, 2 * channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.bn(self.body(x))))


class AffineCoupling(torch.nn.Module):
    """RealNVP's affine coupling over the two halves of dim `dim`: y1 = x1 * exp(tanh(s)) + t
    with (s, t) = F(x2) split on `dim` (a bounded log-scale, as RealNVP / nflows code writes
    it); then y2 from y1 and G the same way."""

    def __init__(self, f: torch.nn.Module, g: torch.nn.Module, dim: int = 1):
        super().__init__()
        self.f, self.g, self.dim = f, g, dim

    def half(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        s, t = torch.chunk(h, 2, dim=self.dim)
        return x * torch.exp(torch.tanh(s)) + t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = torch.chunk(x, 2, dim=self.dim)
        y1 = self.half(x1, self.f(x2))
        y2 = self.half(x2, self.g(y1))
        return torch.cat([y1, y2], dim=self.dim)


class GlowCoupling(AffineCoupling):
    """Glow's affine coupling: y1 = (x1 + t) * sigmoid(s + 2), (s, t) = F(x2)."""

    def half(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        s, t = torch.chunk(h, 2, dim=self.dim)
        return (x + t) * torch.sigmoid(s + 2.0)


class RevNet(torch.nn.Module):
    """A RevNet-style CIFAR network: a stem, three stages of additive couplings (BN-ReLU-conv
    in F and G) separated by BN-ReLU-conv stride-2 downsamplings (not invertible), and a head.
    `coupling`: "additive", or "affine" / "glow" for AffineCoupling blocks (F and G ending in
    a 1x1 conv to (s, t))."""

    def __init__(
        self, widths=(32, 64, 128), blocks=(6, 6, 6), classes: int = 10, coupling: str = "additive"
    ):
        super().__init__()
        layers = [torch.nn.Conv2d(3, widths[0], 3, padding=1, bias=False)]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            if i:
                layers += [
                    torch.nn.BatchNorm2d(widths[i - 1]),
                    torch.nn.ReLU(),
                    torch.nn.Conv2d(widths[i - 1], w, 3, stride=2, padding=1, bias=False),
                ]
            if coupling == "additive":
                layers += [
                    AdditiveCoupling(RevResidualFn(w // 2), RevResidualFn(w // 2)) for _ in range(n)
                ]
            elif coupling in ("affine", "glow"):
                kind = GlowCoupling if coupling == "glow" else AffineCoupling
                layers += [
                    kind(AffineResidualFn(w // 2), AffineResidualFn(w // 2)) for _ in range(n)
                ]
            else:
                raise ValueError(
                    f"RevNet: coupling must be additive, affine or glow, not {coupling!r}"
                )
        layers += [
            torch.nn.BatchNorm2d(widths[-1]),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(widths[-1], classes),
        ]
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class RevAttention(torch.nn.Module):
    """F of a reversible transformer block (Reformer / RevViT layout): pre-LayerNorm
    multi-head self-attention, dropout on the attention weights and the output."""

    def __init__(self, dim: int, heads: int, p: float):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.drop_attn = torch.nn.Dropout(p)
        self.drop_out = torch.nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q = q.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        h = (self.drop_attn(a) @ v).transpose(1, 2).reshape(b, t, d)
        return self.drop_out(self.out(h))


class RevMLP(torch.nn.Module):
    """G of a reversible transformer block: pre-LayerNorm Linear-GELU-Linear, dropout."""

    def __init__(self, dim: int, hidden: int, p: float):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)
        self.drop = torch.nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x)))))


class RevTransformer(torch.nn.Module):
    """A reversible transformer stack over (batch, tokens, 2 * dim): each block is an additive
    coupling over the last dim with attention as F and the MLP as G; a LayerNorm and a linear
    head after the stack."""

    def __init__(
        self, dim: int = 128, heads: int = 4, depth: int = 6, p: float = 0.1, classes: int = 10
    ):
        super().__init__()
        self.blocks = torch.nn.Sequential(
            *[
                AdditiveCoupling(RevAttention(dim, heads, p), RevMLP(dim, 4 * dim, p), dim=-1)
                for _ in range(depth)
            ]
        )
        self.norm = torch.nn.LayerNorm(2 * dim)
        self.head = torch.nn.Linear(2 * dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(x)))


# --- The main job's models (python -m memslim demo) -----------------------------------------


class TrainableAct(torch.nn.Module):
    """A hand-written activation with two trainable 0-dim parameters, as a forum user
    writes one: x * sigmoid(beta x) above 0, alpha (exp(x) - 1) below. Eager autograd keeps
    every intermediate (six full-size tensors per call where ReLU keeps one); smooth, so
    fp32 gradients can be compared (FracAct's x^(-a) at 0+ makes them noise)."""

    def __init__(self):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.tensor(1.2))
        self.alpha = torch.nn.Parameter(torch.tensor(0.8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = x * torch.sigmoid(self.beta * x)
        neg = self.alpha * (torch.exp(torch.clamp_max(x, 0.0)) - 1)
        return torch.where(x > 0, pos, neg)


def custom_act_resnet(classes: int = 10, seed: int = 0, blocks=(1, 1, 1, 1)) -> torch.nn.Module:
    """torchvision's ResNet of BasicBlocks (`blocks` per stage: (2, 2, 2, 2) is ResNet-18,
    (1, 1, 1, 1) ResNet-10) with every ReLU replaced by TrainableAct."""
    from torchvision.models.resnet import BasicBlock, ResNet

    torch.manual_seed(seed)
    return swap_activation(
        ResNet(BasicBlock, list(blocks), num_classes=classes), torch.nn.ReLU, TrainableAct
    )


class RMSNorm(torch.nn.Module):
    """Llama's RMSNorm, written by hand as its reference code does."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class DecoderBlock(torch.nn.Module):
    """Pre-norm causal self-attention and a SwiGLU MLP, no biases (Llama's layout; learned
    positions instead of rotary ones)."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim)
        self.gate = torch.nn.Linear(dim, hidden, bias=False)
        self.up = torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).chunk(3, dim=-1)
        q = q.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class TinyDecoder(torch.nn.Module):
    """A small Llama-style language model: token and position embeddings, `depth`
    DecoderBlocks, a final RMSNorm and an untied vocabulary head. forward(ids) returns the
    logits; forward(ids, targets) the next-token cross-entropy (as transformers' models do
    with labels=), so the loss head is part of the model's graph."""

    def __init__(
        self,
        vocab: int = 2048,
        dim: int = 128,
        depth: int = 2,
        heads: int = 4,
        hidden: int = 352,
        seq: int = 128,
    ):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = torch.nn.ModuleList([DecoderBlock(dim, heads, hidden) for _ in range(depth)])
        self.norm = RMSNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), targets[:, 1:].reshape(-1)
        )


def tiny_decoder(seed: int = 0, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    return TinyDecoder(**kwargs)
