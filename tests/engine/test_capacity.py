"""Knob validation: pools too small for their slots, chunk sizes and decoder weights that
cannot work, and the run-time fallback when the pool runs dry anyway."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from oasr.cache import CacheConfig
from oasr.decoding import GpuDecoderConfig
from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.events import Done
from oasr.engine.runner.capacity import blocks_for_one_stream, check_pool_covers_slots

GEOMETRY = dict(num_layers=2, n_kv_head=2, head_dim=8, hidden_dim=16, kernel_size=3,
                chunk_size=16, block_size_frames=16, device="cpu", dtype=torch.float32)


def test_a_pool_smaller_than_its_slots_windows_is_refused_with_what_to_change() -> None:
    with pytest.raises(ValueError, match=r"5 x 32 = 160; raise max_num_blocks to 160, lower "
                       r"max_batch_size to 1"):
        CacheConfig(**GEOMETRY, num_left_chunks=4, max_num_blocks=8, max_batch_size=32,
                    max_blocks_per_seq=8)
    config = CacheConfig(**GEOMETRY, num_left_chunks=4, max_num_blocks=160, max_batch_size=32,
                         max_blocks_per_seq=8)
    assert blocks_for_one_stream(config) == 5
    check_pool_covers_slots(config)


def test_a_pool_giving_each_stream_one_block_is_refused() -> None:
    config = CacheConfig(**GEOMETRY, max_num_blocks=70, max_batch_size=64)  # 0.64 s each
    with pytest.raises(ValueError, match="only 1 block .* raise --max-num-blocks to >= 128"):
        check_pool_covers_slots(config)
    check_pool_covers_slots(replace(config, max_num_blocks=128))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("chunk_size", 1, "chunk_size 1 is below 4"),
    ("idle_timeout_s", math.nan, "idle_timeout_s=nan: it must be >= 0"),
    ("min_audio_rate", 1.5, "min_audio_rate must be in"),
    ("audio_rate_window_s", math.inf, "audio_rate_window_s must be a finite"),
])
def test_engine_knobs_out_of_range_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["lm_weight", "lm_unit_bonus", "lm_word_bonus",
                                   "word_oov_penalty", "blank_penalty"])
def test_decoder_weights_must_be_finite(field: str) -> None:
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match=f"{field} must be"):
            GpuDecoderConfig(**{field: bad})  # type: ignore[arg-type]


def test_engine_refuses_a_short_pool_at_construction(engine_config: EngineConfig) -> None:
    short = replace(engine_config, num_left_chunks=4, max_num_blocks=8)
    with pytest.raises(ValueError, match="raise max_num_blocks to 20"):
        ASREngine(short)


def test_a_dry_pool_at_run_time_ends_streams_with_length_not_the_engine(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    engine = ASREngine(engine_config)
    events: dict[int, list] = {1: [], 2: []}
    for sid in events:
        engine.submit(OpenStream(sid, events[sid].append))
        engine.submit(AppendAudio(sid, speech[0][: 16000 * 2]))
    engine.step()  # admit both
    pool = engine.resources.pool
    stolen = pool.allocate(pool.num_free_blocks)  # something else took every free block
    for _ in range(20):
        engine.step()
    dones = {sid: [e for e in evs if isinstance(e, Done)] for sid, evs in events.items()}
    assert all(d and d[0].finish_reason == "length" for d in dones.values()), dones
    pool.free(stolen)
    engine.submit(OpenStream(3, (third := []).append))  # the engine goes on serving
    engine.submit(AppendAudio(3, speech[0][: 16000 * 2]))
    engine.submit(EndStream(3))
    for _ in range(40):
        engine.step()
    assert [e.finish_reason for e in third if isinstance(e, Done)] == ["stop"]
    assert pool.num_free_blocks == engine.resources.cache_config.max_num_blocks
