"""Saved-for-backward bytes of the memslim ops (saved_tensors_hooks, distinct storages)."""

import pytest
import torch
import torch.nn.functional as F

import memslim
from memslim import _numerics as N

M = torch.ops.memslim
ROWS, COLS = 64, 1024
NUMEL = ROWS * COLS
OUT = NUMEL * 4  # fp32 output
BITS = NUMEL // 8  # one bit per element

OUTPUT_BITS_EXACT = ["gelu", "gelu_tanh", "silu", "mish", "hardswish"]
MASK_ONLY = ["leaky_relu", "leaky_relu_0.2", "hardsigmoid", "relu"]
OUTPUT_ONLY = ["softplus", "elu", "elu_a05_s2_i15", "celu", "selu", "sigmoid", "tanh"]
OUTPUT_AND_BIT = ["softplus_b2_t1", "elu_neg_alpha"]


def x64k():
    return torch.randn(ROWS, COLS, requires_grad=True)


@pytest.mark.parametrize("name", OUTPUT_BITS_EXACT)
def test_nonmonotonic_saves_output_plus_bits(name):
    x = x64k()
    got = memslim.saved_bytes(N.CASES[name].ours, x)
    aten = memslim.saved_bytes(N.CASES[name].aten, x)
    # Output + n/8 bytes of bits + the exact list (int32 index + fp32 value per
    # element within 2e-3 of the minimum: ~0.1% of N(0,1) inputs).
    n_band = int(((x.detach() - N.CASES[name].x_min).abs() < 2e-3).sum())
    assert got == OUT + BITS + 8 * n_band
    assert got <= (OUT + BITS) * 1.01
    assert aten >= NUMEL * 4  # aten keeps the input (silu/gelu/mish/hardswish)


@pytest.mark.parametrize("name", MASK_ONLY)
def test_mask_only_saves_one_bit_per_element(name):
    assert memslim.saved_bytes(N.CASES[name].ours, x64k()) == BITS


@pytest.mark.parametrize("name", OUTPUT_ONLY)
def test_monotonic_saves_output_only(name):
    assert memslim.saved_bytes(N.CASES[name].ours, x64k()) == OUT


@pytest.mark.parametrize("name", OUTPUT_AND_BIT)
def test_params_needing_a_bit_save_output_plus_bits(name):
    assert memslim.saved_bytes(N.CASES[name].ours, x64k()) == OUT + BITS


class MLP(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.a = torch.nn.Linear(COLS, COLS)
        self.b = torch.nn.Linear(COLS, COLS)
        self.act = act

    def forward(self, x):
        return self.b(self.act(self.a(x)))


def test_mlp_output_saving_frees_the_activation_input():
    # Linear -> GELU -> Linear: aten keeps x, h=a(x) (GELU input) and GELU's
    # output (linear b's input); memslim keeps x, the output and the bits.
    torch.manual_seed(0)
    eager = MLP(F.gelu)
    ours = MLP(lambda t: M.gelu(t))
    ours.load_state_dict(eager.state_dict())
    x = torch.randn(ROWS, COLS)
    b_eager = memslim.saved_bytes(eager, x)
    b_ours = memslim.saved_bytes(ours, x)
    assert b_eager == 3 * OUT
    assert 2 * OUT + BITS <= b_ours <= 2 * OUT + BITS + OUT // 100


def test_saved_bytes_excludes_parameters_and_restores_state():
    lin = torch.nn.Linear(16, 16)
    bn = torch.nn.BatchNorm1d(16)
    model = torch.nn.Sequential(lin, bn)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, 16)
    n = memslim.saved_bytes(model, x)
    # Linear saves its input (512 B); batch_norm saves its input, its two
    # per-channel statistics (save_mean, save_invstd) and the running_mean /
    # running_var buffers (64 B each: buffers are not parameters, so they
    # count). Weight and bias: excluded.
    assert n == 8 * 16 * 4 * 2 + 4 * 16 * 4
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert lin.weight.grad is None
