"""bench/gpu_check.py part 4: a training step of three suite models through four ways.

What: a GELU ResNet (torchvision's resnet18, ReLU -> GELU), BERT (transformers' BertModel,
2 layers) and the custom-activation ResNet (memslim._models.custom_act_resnet: a ResNet-10
with a hand-written trainable activation), each through eager, torch.compile,
torch.compile(backend="memslim") and memslim.compile(memory_budget=0.5) on `device`: the
step's peak above its resting memory (torch.cuda.max_memory_allocated), saved bytes
(saved_tensors_hooks), the step time as a ratio to eager's (medians of interleaved
rounds, synchronised), and the step-1 gradient difference to eager's (relative L2, the
worst tensor), judged as memslim.probe judges it: against a float64 eager step, within
4x eager's own error + 1e-4. Where torchvision or transformers is missing (the GPU
machine's image need not have them) a built-in copy of the model stands in, and the
row says so. A way that raises is a FAIL row with the first line; a way that needs
torch 2.14's internals on an older torch is a skip row with the reason.
Why: issue 47's part 4, the suite's models on a GPU, once, within minutes.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Callable, List

import torch
import torch.nn.functional as F

from _gpu_check_common import FAIL, INFO, OK, SKIP, Row, first_line, fmt, sync, torch_version


# --- stand-ins for torchvision's ResNet and transformers' BERT ------------------------------


class _Block(torch.nn.Module):
    def __init__(self, cin, cout, stride, act):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1, self.act1 = torch.nn.BatchNorm2d(cout), act()
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2, self.act2 = torch.nn.BatchNorm2d(cout), act()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(
                torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        return self.act2(self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x))))) + idt)


class _ResNet(torch.nn.Module):
    """torchvision's ResNet of BasicBlocks, written out (stem, 4 stages, pool, fc)."""

    def __init__(self, blocks, act, classes):
        super().__init__()
        layers = [
            torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            torch.nn.BatchNorm2d(64),
            act(),
            torch.nn.MaxPool2d(3, 2, 1),
        ]
        cin = 64
        for i, (w, n) in enumerate(zip((64, 128, 256, 512), blocks)):
            for j in range(n):
                layers.append(_Block(cin, w, 2 if i and not j else 1, act))
                cin = w
        layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(512, classes)]
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class _BertLayer(torch.nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.ln1, self.ln2 = torch.nn.LayerNorm(d, eps=1e-12), torch.nn.LayerNorm(d, eps=1e-12)
        self.up, self.down = torch.nn.Linear(d, ff), torch.nn.Linear(ff, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.out(a))
        return self.ln2(x + self.down(F.gelu(self.up(x))))


class _Bert(torch.nn.Module):
    """BERT's encoder (post-norm layers, GELU MLP), embeddings included."""

    def __init__(self, vocab=30522, d=768, layers=2, heads=12, ff=3072, seq=512):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.ln = torch.nn.LayerNorm(d, eps=1e-12)
        self.layers = torch.nn.ModuleList(_BertLayer(d, heads, ff) for _ in range(layers))

    def forward(self, ids):
        x = self.ln(self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device)))
        for layer in self.layers:
            x = layer(x)
        return x


def _gelu_resnet(small=False):
    if small:  # the CPU smoke: fewer kernels for Inductor to compile
        torch.manual_seed(0)
        return _ResNet((1, 1, 1, 1), torch.nn.GELU, 1000), "built-in ResNet-10 (smoke)"
    try:
        from memslim._models import gelu_resnet

        return gelu_resnet("resnet18"), "torchvision resnet18"
    except ImportError:
        torch.manual_seed(0)
        return _ResNet((2, 2, 2, 2), torch.nn.GELU, 1000), "built-in resnet18 (no torchvision)"


def _custom_act_resnet():
    from memslim._models import TrainableAct

    try:
        from memslim._models import custom_act_resnet

        return custom_act_resnet(), "torchvision ResNet-10"
    except ImportError:
        torch.manual_seed(0)
        return _ResNet((1, 1, 1, 1), TrainableAct, 10), "built-in ResNet-10 (no torchvision)"


def _bert(small=False):
    if small:
        torch.manual_seed(0)
        return _Bert(vocab=1000, d=64, layers=1, heads=4, ff=128), "built-in BERT, 1 small layer"
    try:
        import transformers

        from memslim.probe import zero_dropout

        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        cfg = transformers.BertConfig(
            num_hidden_layers=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        )
        model = transformers.BertModel(cfg, add_pooling_layer=False)
        zero_dropout(model)

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.model = m

            def forward(self, ids):
                return self.model(input_ids=ids).last_hidden_state

        return Wrap(model), "transformers BertModel, 2 layers"
    except ImportError:
        torch.manual_seed(0)
        return _Bert(), "built-in BERT encoder, 2 layers (no transformers)"


def model_specs(small: bool):
    """name -> (factory, (args, target) on the CPU, loss)."""
    g = torch.Generator().manual_seed(1234)
    b, hw, seq = (2, 32, 16) if small else (32, 128, 128)

    def ce(out, t):
        return F.cross_entropy(out, t)

    def sq(out, t):
        return out.float().square().mean()

    img = torch.randn(b, 3, hw, hw, generator=g)
    return {
        "gelu_resnet18": (
            lambda: _gelu_resnet(small),
            ((img,), torch.randint(0, 1000, (b,), generator=g)),
            ce,
        ),
        "bert_2layer": (
            lambda: _bert(small),
            ((torch.randint(0, 1000, (b // 4 or 1, seq * 4), generator=g),), torch.zeros(())),
            sq,
        ),
        "custom_act_resnet10": (
            _custom_act_resnet,
            ((img,), torch.randint(0, 10, (b,), generator=g)),
            ce,
        ),
    }


# --- the ways ------------------------------------------------------------------------------


def _ways():
    import memslim

    return [
        ("eager", lambda m: m),
        ("torch.compile", lambda m: torch.compile(m)),
        ('compile(backend="memslim")', lambda m: torch.compile(m, backend="memslim")),
        ("memslim.compile(budget 0.5)", lambda m: memslim.compile(m, memory_budget=0.5)),
    ]


class _Run:
    """One way's compiled step and what it measured."""

    def __init__(self, name, fn, model, batch, loss_fn):
        self.name, self.fn, self.model = name, fn, model
        self.params = list(model.parameters())
        self.opt = torch.optim.SGD(self.params, lr=1e-3)
        self.batch, self.loss_fn = batch, loss_fn
        self.times: List[float] = []

    def step(self):
        args, target = self.batch
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.fn(*args), target)
        loss.backward()
        return loss


def _peak(run: _Run, device: str):
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run.step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _mib(n):
    return "-" if n is None else f"{n / 2**20:.1f}"


def _needs_214(e: BaseException) -> bool:
    """An error of a way that relies on torch 2.14's internals, on an older torch."""
    while getattr(e, "inner_exception", None) is not None:  # Dynamo's BackendCompilerFailed
        e = e.inner_exception
    return torch_version() < (2, 14) and isinstance(e, (AttributeError, ImportError))


def _one_model(rows, name, spec, device, deadline, timer: Callable):
    from memslim.probe import grad_difference, grad_excess, saved_bytes_of_step

    factory, batch_cpu, loss_fn = spec
    reference, what = factory()
    reference.train()
    init = copy.deepcopy(reference.state_dict())
    batch = (tuple(a.to(device) for a in batch_cpu[0]), batch_cpu[1].to(device))
    m64 = copy.deepcopy(reference).double().to(device)
    args64 = tuple(a.double() if a.is_floating_point() else a for a in batch[0])
    t64 = batch[1].double() if batch[1].is_floating_point() else batch[1]
    loss_fn(m64(*args64), t64).backward()
    exact = {n: p.grad.detach() for n, p in m64.named_parameters() if p.grad is not None}
    del m64
    runs, eager, ref_excess = [], None, 1.0
    for way, build in _ways():
        label = f"{name} {way}"
        if time.monotonic() > deadline:
            rows.append(Row("4 models", label, SKIP, "the checks' time budget is spent"))
            continue
        t0 = time.perf_counter()
        try:
            model = copy.deepcopy(reference).to(device)
            model.load_state_dict(init)
            run = _Run(way, build(model), model, batch, loss_fn)
            run.step()
            sync(device)
            first = time.perf_counter() - t0
            grads = {
                n: p.grad.detach().clone()
                for n, p in model.named_parameters()
                if p.grad is not None
            }
            eager = eager or grads
            diff = grad_difference(grads, eager)
            excess = grad_excess(grads, eager, exact)
            run.opt.zero_grad(set_to_none=True)
            saved = saved_bytes_of_step(
                run.fn, batch[0], lambda o: loss_fn(o, batch[1]), run.params
            )
            run.opt.zero_grad(set_to_none=True)
            peak = _peak(run, device)
            runs.append(run)
            if way == "torch.compile":
                status, ref_excess = INFO, max(1.0, excess or 0.0)  # the reference's own drift
            else:
                # torch.compile's own drift, with room for its run-to-run reordering
                status = OK if excess is None or excess <= 1.25 * ref_excess else FAIL
            run.row = Row(
                "4 models",
                label,
                status,
                f"peak {_mib(peak)} MiB, saved {_mib(saved)} MiB, grad diff {fmt(diff)}"
                + (f" (x{excess:.2f} of rounding)" if excess is not None else "")
                + f", first step {first:.1f} s",
                "grad within 4x eager's fp64 error + 1e-4"
                + (f"; {what}" if way == "eager" else ""),
                time.perf_counter() - t0,
            )
            rows.append(run.row)
        except Exception as e:  # noqa: BLE001  (one way failing must not hide the others)
            status = SKIP if _needs_214(e) else FAIL
            why = ("needs torch 2.14 internals: " if status == SKIP else "") + first_line(e)
            rows.append(Row("4 models", label, status, why, "", time.perf_counter() - t0))
    _time_rounds(runs, device, timer)


def _time_rounds(runs, device, timer, rounds: int = 10):
    """Interleaved rounds (a different way first each round); each row gets its median
    step time as a ratio to the first (eager's)."""
    if not runs:
        return
    for r in range(rounds):
        for run in runs[r % len(runs) :] + runs[: r % len(runs)]:
            run.times.append(timer(run.step))
    base = statistics.median(runs[0].times)
    for run in runs:
        med = statistics.median(run.times)
        run.row.value += f", step {med * 1e3:.1f} ms (x{med / base:.2f} eager)"


def part_models(rows: List[Row], device: str, small: bool, deadline: float) -> None:
    from _gpu_check_opcheck_speed import _timer

    timer = _timer(device)
    for name, spec in model_specs(small).items():
        torch._dynamo.reset()
        t0 = time.perf_counter()
        try:
            _one_model(rows, name, spec, device, deadline, timer)
        except Exception as e:  # noqa: BLE001
            rows.append(Row("4 models", name, FAIL, first_line(e), "", time.perf_counter() - t0))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
