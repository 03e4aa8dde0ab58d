"""The CTC decoder's state is pooled for good at engine build (issue #49, item 4).

One row per stream slot and token buffers for the longest segment the engine lets a stream
decode are allocated when the engine is built: admitting a stream or growing its hypotheses
never reallocates the storage or copies a live row, and a segment ends (``max_length``)
before its tokens could outgrow the buffers.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from engine_helpers import Collector, run_until_idle

from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
from oasr.decoding.endpoint import EndpointConfig
from oasr.engine import ASREngine, EngineConfig, Error, Final
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.runner import streams
from oasr.engine.runner.streams import segment_frame_limit


def _storage(state) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Where each field of a batch-1 state lives (its row is a view of the decoder's storage)."""
    return {name: getattr(state, name).untyped_storage().data_ptr()
            for name in ("log_pb", "prefix_len", "tokens", "token_frames")}


@pytest.mark.parametrize("beam_size", [1, 4])
def test_admissions_and_long_segments_never_move_the_decoder_rows(
        engine_config: EngineConfig, speech: list[np.ndarray], beam_size: int) -> None:
    """12 slots (more than a storage that grows starts with) and 5 s segments (more tokens
    than its first buffers hold): every state of every stream lives in the storage allocated
    at build, from its admission to its end."""
    config = replace(engine_config, max_batch_size=12, max_num_blocks=12 * 24,
                     decoder=GpuDecoderConfig(beam_size=beam_size))
    engine = ASREngine(config)
    res = engine.resources
    events = Collector()
    places: set[tuple[tuple[str, int], ...]] = set()
    audio = speech[2][: 16000 * 5]  # 125 encoder frames: past 64 token columns
    for sid in range(1, 13):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio[: 16000 * sid // 4]))
        engine.step()  # admitted one by one, while the earlier ones decode
        places |= {tuple(sorted(_storage(res.ctc.get_state(s)).items()))
                   for s in engine.requests if s in res.ctc}
    for sid in range(1, 13):
        engine.submit(AppendAudio(sid, audio[16000 * sid // 4 :]))
        engine.submit(EndStream(sid))
    for _ in range(10_000):
        places |= {tuple(sorted(_storage(res.ctc.get_state(s)).items()))
                   for s in engine.requests if s in res.ctc}
        if not engine.step() and not engine.requests:
            break
    assert len(places) == 1  # one storage, never reallocated
    assert all(not events.of_type(s, Error) for s in range(1, 13))


def test_a_fixed_decoder_refuses_rows_and_tokens_past_what_it_was_built_for() -> None:
    decoder = GpuStreamingDecoder(GpuDecoderConfig(beam_size=3), device="cpu", rows=2,
                                  max_segment_frames=6)
    a, b = decoder.create_state(1, 5, row=0), decoder.create_state(1, 5, row=1)
    with pytest.raises(ValueError, match="past the 2 rows"):
        decoder.create_state(1, 5, row=2)
    with pytest.raises(ValueError, match="past the 2 rows"):
        decoder.create_state(1, 5)  # no free row left
    gen = torch.Generator().manual_seed(0)
    reference = GpuStreamingDecoder(GpuDecoderConfig(beam_size=3, initial_token_capacity=2),
                                    device="cpu")
    ref_a, ref_b = reference.create_state(1, 5), reference.create_state(1, 5)
    for _ in range(3):  # 6 frames of a token each: as many as the buffers hold
        lp = torch.randn(2, 2, 5, generator=gen)
        lp[:, 0, 1] += 20.0  # tokens 1 2 1 2 ...: every frame emits one
        lp[:, 1, 2] += 20.0
        lp = lp.log_softmax(-1)
        decoder.decode_streams(lp, [a, b])
        reference.decode_streams(lp, [ref_a, ref_b])
    for mine, theirs in ((a, ref_a), (b, ref_b)):
        assert decoder.finalize_stream(mine) == reference.finalize_stream(theirs)
    with pytest.raises(RuntimeError, match="past the 6 this decoder was built for"):
        decoder.decode_streams(torch.randn(2, 1, 5).log_softmax(-1), [a, b])
    decoder.reset_state(a, 1, 5)
    decoder.decode_chunk(torch.randn(1, 6, 5).log_softmax(-1), a)  # a reset row starts over


def test_the_segment_limit_of_each_configuration(engine_config: EngineConfig) -> None:
    res = ASREngine(engine_config).resources  # unlimited history, no endpointing
    fam, cache = res.family, res.cache_config
    assert segment_frame_limit(engine_config, fam, cache) is None  # the K/V ceiling ends it
    assert res.max_segment_frames is None
    evicting = replace(cache, num_left_chunks=4, max_num_blocks=4 * 5)
    assert segment_frame_limit(engine_config, fam, evicting) == 60 / 0.04  # the default
    wenet = replace(engine_config, endpoint=EndpointConfig.wenet_quiet_cut())  # rule 3: 20 s
    assert segment_frame_limit(wenet, fam, evicting) == 500 + 2 * 16
    pause = replace(engine_config, endpoint=EndpointConfig())  # rule 3: 15 s
    assert segment_frame_limit(pause, fam, evicting) == 375 + 2 * 16


def test_a_segment_ends_before_the_decoder_is_full(
        engine_config: EngineConfig, speech: list[np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """History evicted, no endpointing: the segment limit is the default ceiling (here made
    2 s); each segment ends there with reason max_length and the stream goes on."""
    monkeypatch.setattr(streams, "DEFAULT_MAX_SEGMENT_S", 2.0)
    config = replace(engine_config, num_left_chunks=2)
    engine = ASREngine(config)
    assert engine.resources.max_segment_frames == 50
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, speech[2][: 16000 * 7]))
    engine.submit(EndStream(1))
    run_until_idle(engine)
    finals = events.of_type(1, Final)
    assert not events.of_type(1, Error)
    assert [f.reason for f in finals[:3]] == ["max_length"] * 3
    assert events.done(1).finish_reason == "stop"
