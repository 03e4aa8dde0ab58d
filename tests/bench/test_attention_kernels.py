"""bench/attention_kernels.py times several kernels on one attention: they must compute the
same thing (within each dtype's rounding), or the timing compares different work."""

from __future__ import annotations

import pytest
import torch
from support.bench_scripts import load_bench_script

attention_kernels = load_bench_script("attention_kernels")


def test_the_variants_compute_the_same_attention() -> None:
    with torch.inference_mode():
        out = {name: call().float() for name, call in attention_kernels.variants(3).items()}
    reference = out.pop("sdpa float32")
    assert reference.shape == (3, attention_kernels.HEADS, attention_kernels.QUERIES,
                               attention_kernels.HEAD_DIM)
    assert set(out) == {"sdpa bfloat16", "sdpa float16", "matmuls + softmax"}
    for name, value in out.items():
        assert value.shape == reference.shape
        assert float((value - reference).abs().max()) < 0.05, name


def test_padded_queries_and_the_linear_have_the_stated_shapes() -> None:
    with torch.inference_mode():
        padded = {n: c() for n, c in attention_kernels.padded_queries(2, [32, 64]).items()}
        down = attention_kernels.ffn_down(2)()
    assert {n: tuple(t.shape) for n, t in padded.items()} == {
        "32": (2, 6, 32, 64), "64": (2, 6, 64, 64)}
    assert tuple(down.shape) == (2 * 32, 384)


def test_the_script_prints_a_row_per_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert attention_kernels.main(["--streams", "2", "--repeats", "1", "--threads", "1",
                                   "--query-lengths", "32"]) == 0
    printed = capsys.readouterr().out
    for name in ("sdpa bfloat16", "matmuls + softmax", "FFN down linear"):
        assert f"| 2 | {name} |" in printed
    assert "| 2 | 32 |" in printed
