"""bench/int8_linears.py times ways of computing the same linear: they must agree (int8 within
its rounding), or the timing compares different work."""

from __future__ import annotations

import pytest
import torch
from support.bench_scripts import load_bench_script

from oasr.models.whisper.logits import int8_kernels

int8_linears = load_bench_script("int8_linears")


@pytest.mark.parametrize(("k", "n", "gelu"), [(384, 1152, False), (384, 1536, True),
                                              (1536, 384, False)])
def test_the_variants_compute_the_same_linear(k: int, n: int, gelu: bool) -> None:
    try:
        calls = int8_linears.variants(64, k, n, gelu)
        with torch.inference_mode():
            out = {name: call().float() for name, call in calls.items()}
    except (RuntimeError, NotImplementedError) as exc:  # no int8 kernel on this CPU
        pytest.skip(f"an int8 matmul is not available here: {exc}")
    # oneDNN's int8 product only where it is not the slow kernel (x86 without AMX)
    onednn = ("int8", "int8 matmul alone") if "onednn" in int8_kernels() else ()
    assert set(out) == {"bfloat16 fused", "int8 fbgemm", *onednn}
    reference = out["bfloat16 fused"]
    assert reference.shape == (64, n)
    spread = float(reference.abs().max())
    for name in ("int8 fbgemm", *onednn):
        assert out[name].shape == reference.shape
        error = float((out[name] - reference).abs().max()) / spread
        assert error < 0.05, (name, error)
    if onednn:
        assert torch.equal(out["int8"], out["int8 matmul alone"])  # the same quantized input
