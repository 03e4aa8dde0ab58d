"""The decoder K/V quantization options and the refusals of unservable formats, by name."""

from __future__ import annotations

import pytest
import torch
from whisper_testutil import TINY_SPEC, tiny_model

from oasr.models.whisper import WhisperCheckpoint
from oasr.models.whisper.quantization import (
    check_kv_cache_servable,
    kv_cache_format,
    parse_quantization_options,
)
from oasr.models.whisper.transcriber import WhisperDecodeConfig, WhisperTranscriber

CPU = torch.device("cpu")
OK = {"kv_cache_dtypes": ("fp8_e4m3",), "model_dtype": torch.float32, "device": CPU,
      "head_dim": 64, "attn_backend": "torch"}


def test_parse_quantization_options() -> None:
    assert parse_quantization_options(["kv_cache=fp8_e4m3"]) == {"kv_cache": "fp8_e4m3"}
    assert parse_quantization_options([]) == {}
    with pytest.raises(ValueError, match="'kv_cache' is not KEY=VALUE"):
        parse_quantization_options(["kv_cache"])
    with pytest.raises(ValueError, match="unknown quantization option 'weights'"):
        parse_quantization_options(["weights=int8"])
    with pytest.raises(ValueError, match="given twice"):
        parse_quantization_options(["kv_cache=fp8_e4m3", "kv_cache=fp8_e4m3"])
    with pytest.raises(ValueError, match="unknown decoder kv_cache format 'fp4'"):
        parse_quantization_options(["kv_cache=fp4"])
    assert kv_cache_format(None) is None and kv_cache_format({"kv_cache": "fp8_e4m3"}) == "fp8_e4m3"
    with pytest.raises(ValueError, match=r"unknown quantization keys \['act'\]"):
        kv_cache_format({"act": "fp8"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kv_cache_dtypes": None}, "needs an autoregressive decoder"),
        ({"kv_cache_dtypes": ()}, r"does not list kv_cache=fp8_e4m3 \(it lists \[\]\)"),
        ({"device": torch.device("cuda")}, "on CUDA needs a float16/bfloat16 model, got float32"),
        ({"head_dim": 72}, "head dim 72 cannot be tiled"),
        ({"head_dim": 512}, "head dim 512 cannot be tiled"),
        ({"attn_backend": "sdpa"}, "not served by OASR_ATTN_BACKEND=sdpa"),
        ({"attn_backend": "cute"}, "not served by OASR_ATTN_BACKEND=cute"),
    ],
)
def test_fp8_refusals(change: dict, message: str) -> None:
    check_kv_cache_servable("fp8_e4m3", **OK)
    with pytest.raises(ValueError, match=message):
        check_kv_cache_servable("fp8_e4m3", **{**OK, **change})
    check_kv_cache_servable(None, **{**OK, **change})  # the served dtype is always servable


def test_fp8_backend_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OASR_ATTN_BACKEND", "sdpa")
    with pytest.raises(ValueError, match="OASR_ATTN_BACKEND=sdpa"):
        check_kv_cache_servable("fp8_e4m3", **{**OK, "attn_backend": None})


def test_transcriber_refuses_at_construction(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    checkpoint = WhisperCheckpoint(tiny_model(), None, TINY_SPEC, tmp_path)  # type: ignore[arg-type]
    monkeypatch.setenv("OASR_ATTN_BACKEND", "sdpa")
    with pytest.raises(ValueError, match="OASR_ATTN_BACKEND=sdpa"):
        WhisperTranscriber(checkpoint, WhisperDecodeConfig(kv_cache="fp8_e4m3"))
    assert WhisperTranscriber(checkpoint, WhisperDecodeConfig()).manager is not None


def test_decode_config_validation() -> None:
    assert WhisperDecodeConfig(beam_size=2).kv_storage == "auto"
    with pytest.raises(ValueError, match="cannot run beam search"):
        WhisperDecodeConfig(beam_size=2, kv_storage="paged")
    with pytest.raises(ValueError, match="max_num_blocks \\(2\\) < max_rows \\(4\\)"):
        WhisperDecodeConfig(max_rows=4, max_num_blocks=2)
