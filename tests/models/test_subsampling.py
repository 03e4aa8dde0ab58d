"""The conv stem gives the same bits whether a batch goes through in one call or in groups."""

from __future__ import annotations

import pytest
import torch

import oasr.models.subsampling as subsampling
from oasr.models.subsampling import Conv2dSubsampling4


def _stem() -> Conv2dSubsampling4:
    torch.manual_seed(0)
    return Conv2dSubsampling4(80, 16, 0.0).eval()


def test_rows_per_call_keeps_the_first_conv_map_within_the_budget(monkeypatch) -> None:
    stem = _stem()
    x = torch.zeros(10, 67, 80)
    row_bytes = 16 * 33 * 39 * 4  # (D, T', F') float32 map of one row
    monkeypatch.setattr(subsampling, "CPU_STEM_BYTES", 3 * row_bytes + 1)
    assert stem.rows_per_call(x) == 3
    monkeypatch.setattr(subsampling, "CPU_STEM_BYTES", 1)
    assert stem.rows_per_call(x) == 1
    monkeypatch.setattr(subsampling, "CPU_STEM_BYTES", 100 * row_bytes)
    assert stem.rows_per_call(x) == 100


@pytest.mark.parametrize("budget_rows", [1, 3, 4])
def test_grouped_stem_is_bit_identical_to_one_call(monkeypatch, budget_rows: int) -> None:
    stem = _stem()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 67, 80, generator=g)
    with torch.inference_mode():
        whole = stem(x)  # 7 rows fit the default budget: one call
        assert stem.rows_per_call(x) >= 7
        monkeypatch.setattr(subsampling, "CPU_STEM_BYTES", budget_rows * 16 * 33 * 39 * 4)
        assert stem.rows_per_call(x) == budget_rows
        grouped = stem(x)
    assert grouped.shape == (7, 16, 16)
    assert torch.equal(grouped, whole)


def test_stem_equals_the_two_convolutions_in_the_default_layout() -> None:
    stem = _stem()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 67, 80, generator=g)
    with torch.inference_mode():
        y = stem.conv(x.unsqueeze(1))  # (B, D, T', F') through nn.Conv2d / nn.ReLU
        b, c, t, f = y.shape
        reference = stem.pos_enc.scale(stem.out(y.transpose(1, 2).reshape(b, t, c * f)))
        got = stem(x)
    assert got.shape == (3, 16, 16)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)
