"""EngineConfig(prefill_kv_window=True): every running stream holds the same, full window from
admission on, batched streams still equal streams alone, and the pool drains."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import Collector, assert_pool_full, run_until_idle, transcribe_alone

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.request import RequestStatus

WINDOW = 2 * 16  # num_left_chunks=2 chunks of 16 frames


def test_config_refuses_an_unbounded_window(engine_config: EngineConfig) -> None:
    with pytest.raises(ValueError, match="prefill_kv_window needs a bounded window"):
        replace(engine_config, prefill_kv_window=True)


@pytest.mark.parametrize("block", [16, 32, 8])  # one block per chunk, half a chunk, two
def test_every_stream_holds_the_whole_window_every_step(
        engine_config: EngineConfig, speech: list[np.ndarray], block: int) -> None:
    """Every row attends exactly the window, from its first chunk, at any block size (with a
    32-frame block the window begins half way into its first block every other chunk)."""
    config = replace(engine_config, num_left_chunks=2, prefill_kv_window=True,
                     block_size_frames=block)
    engine = ASREngine(config)
    assert engine.resources.cache_config.prefill_frames == WINDOW
    events = Collector()
    audios = speech[:3]
    for sid, audio in enumerate(audios, start=1):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    held: list[int] = []  # each row's cached length as its chunk attends
    family = engine.family
    forward = family.forward_chunk

    def spy(batch):  # type: ignore[no-untyped-def]
        cache = batch.caches[0]
        starts = 0 if cache.cache_starts is None else cache.cache_starts
        held.extend((cache.cache_seqlens - starts).tolist())  # history: the row's frames past
        return forward(batch)                                 # its evicted ones

    family.forward_chunk = spy  # type: ignore[method-assign]
    for _ in range(10_000):
        engine.step()
        att = engine.resources.attention
        for sid, request in engine.requests.items():
            if request.status is RequestStatus.RUNNING:  # the window's blocks, from admission
                blocks = len(att.stream_info(sid).block_ids)
                assert blocks <= engine.resources.cache_config.max_logical_blocks
        if not engine.requests:
            break
    assert len(held) > 20 and set(held) == {WINDOW}
    for sid, audio in enumerate(audios, start=1):
        alone = transcribe_alone(config, audio)
        assert events.finals(sid) == alone.finals(1)
        assert events.done(sid).finish_reason == "stop"
    assert_pool_full(engine)


def test_the_window_changes_what_a_stream_attends(engine_config: EngineConfig,
                                                   speech: list[np.ndarray]) -> None:
    """The zeroed window is attended (it is the trained mask's padding), so a stream's first
    chunks differ from one that attends only what it has heard; later ones agree again once
    real history has pushed the zeros out of every layer's window and the conv's carry."""
    bounded = replace(engine_config, num_left_chunks=2)
    logits = {}
    for prefill in (False, True):
        engine = ASREngine(replace(bounded, prefill_kv_window=prefill))
        captured = []
        family = engine.family
        forward = family.forward_chunk

        def spy(batch, forward=forward, captured=captured):  # type: ignore[no-untyped-def]
            out = forward(batch)
            captured.append(out[0].clone())
            return out

        family.forward_chunk = spy  # type: ignore[method-assign]
        events = Collector()
        engine.submit(OpenStream(1, events.sink(1)))
        engine.submit(AppendAudio(1, speech[2]))
        engine.submit(EndStream(1))
        run_until_idle(engine)
        logits[prefill] = captured
    plain, windowed = logits[False], logits[True]
    assert len(plain) == len(windowed) > 4
    assert (plain[0] - windowed[0]).abs().max() > 1e-3
    for a, b in zip(plain[5:], windowed[5:], strict=True):  # 2 layers x 2 chunks, then the conv
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4)
