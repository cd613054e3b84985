"""Input-gradient exactness of the output-saving ops (docs/measurements.md's numerics table).

fp32: dense sweep of [-20, 20] (400k points), 200k N(0,1) samples, and 400k
points around each non-monotonic function's minimum; error relative to
|grad_out| must stay under 1e-4 (optiacts' fitted inverse reaches 1.9e-2).
16-bit: every representable value in [-20, 20]; near the minimum
(|x - x*| <= 0.8) the error must stay within 4x aten's own 16-bit backward.
"""

import pytest
import torch

from memslim import _numerics as N


@pytest.mark.parametrize("name", sorted(N.CASES))
def test_fp32_within_1e4_of_aten(name):
    row = N.table_row(name, torch.float32)
    assert row["max_err"] < 1e-4, row


@pytest.mark.parametrize("name", N.NON_MONOTONIC)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_near_minimum_within_4x_aten(name, dtype):
    row = N.table_row(name, dtype)
    assert row["near_min_err"] <= 4 * row["aten_near_min_err"], row
    # Overall: within 2.5x aten's own 16-bit error (measured: up to exactly 2x,
    # hardswish bf16 near x = 3, where the rounded output is off by one ulp).
    assert row["max_err"] <= 2.5 * row["aten_max_err"], row


@pytest.mark.parametrize("name", sorted(set(N.CASES) - set(N.NON_MONOTONIC)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_monotonic_close_to_aten(name, dtype):
    row = N.table_row(name, dtype)
    assert row["max_err"] <= 2 * row["aten_max_err"] + 1e-6, row
