"""ASREngine: batched streams equal streams alone, and every ending returns the pool to full."""

from __future__ import annotations

import logging
import math
import random
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
import torch
from engine_helpers import Collector, assert_pool_full, run_until_idle, stream_all, transcribe_alone

from oasr.audio import FrameEnergy
from oasr.decoding import EndpointConfig
from oasr.engine import ASREngine, EngineConfig, Error, Final, Partial, Ready
from oasr.engine.commands import AbortStream, AppendAudio, EndStream, OpenStream
from oasr.engine.runner.memory import cache_config_for
from oasr.models import ConformerConfig


def _feed_interleaved(engine: ASREngine, audios: list[np.ndarray], events: Collector,
                      seed: int) -> None:
    """Open every stream at a random step, feed random-sized pieces in random order, step."""
    rng = random.Random(seed)
    cursors = [0] * len(audios)
    opened = [False] * len(audios)
    while not all(c >= len(a) for c, a in zip(cursors, audios, strict=True)):
        i = rng.randrange(len(audios))
        sid = i + 1
        if not opened[i]:
            engine.submit(OpenStream(sid, events.sink(sid)))
            opened[i] = True
        if cursors[i] < len(audios[i]):
            n = rng.choice([160, 1000, 3200, 12000, 40000])
            engine.submit(AppendAudio(sid, audios[i][cursors[i] : cursors[i] + n]))
            cursors[i] += n
            if cursors[i] >= len(audios[i]):
                engine.submit(EndStream(sid))
        if rng.random() < 0.5:
            engine.step()
    run_until_idle(engine)


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_streams_equal_each_stream_alone(engine_config: EngineConfig,
                                                 speech: list[np.ndarray], seed: int) -> None:
    alone = [transcribe_alone(engine_config, audio) for audio in speech]
    engine = ASREngine(engine_config)
    events = Collector()
    _feed_interleaved(engine, speech, events, seed)
    for i in range(len(speech)):
        sid = i + 1
        assert events.done(sid).finish_reason == "stop"
        assert events.finals(sid) == alone[i].finals(1)
        partials = [e.text for e in events.of_type(sid, Partial)]
        assert partials == [e.text for e in alone[i].of_type(1, Partial)]
    assert any(events.finals(i + 1) for i in range(len(speech))), "model emitted no text at all"
    assert_pool_full(engine)


def test_one_step_runs_every_ready_stream_in_one_forward(engine_config: EngineConfig,
                                                         speech: list[np.ndarray]) -> None:
    engine = ASREngine(engine_config)
    calls: list[int] = []
    forward = engine.resources.runner.forward

    def counting_forward(plan):  # type: ignore[no-untyped-def]
        calls.append(len(plan.stream_ids))
        return forward(plan)

    engine.resources.runner.forward = counting_forward  # type: ignore[method-assign]
    events = Collector()
    for sid, audio in enumerate(speech, start=1):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio[:16000]))  # 1 s each: one full window ready
    engine.step()  # admit
    engine.step()
    assert calls and calls[0] == len(speech)


def test_the_step_decodes_in_inference_mode_and_the_caller_stays_out_of_it(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    """The CTC search runs without autograd bookkeeping (its small ops are 10-20 % cheaper
    so); the engine's caller is left in the mode it was in, and calibration and shutdown,
    which touch the same tensors, work after steps."""
    engine = ASREngine(replace(engine_config, max_batch_size=4))
    modes: list[bool] = []
    decoder = engine.resources.ctc.decoder
    decode_streams = decoder.decode_streams

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        modes.append(torch.is_inference_mode_enabled())
        return decode_streams(*args, **kwargs)

    decoder.decode_streams = recording  # type: ignore[method-assign]
    events = stream_all(engine, speech[0])
    run_until_idle(engine)
    assert modes and all(modes)
    assert not torch.is_inference_mode_enabled()
    assert events.done(1).finish_reason
    engine.calibrate(num_streams=2, seconds=1.0)
    engine.shutdown()


def test_capacity_ceiling_finishes_with_length_and_transcript(engine_config: EngineConfig,
                                                              speech: list[np.ndarray]) -> None:
    # 8 blocks for 4 slots: 2 blocks (32 frames, 1.28 s) per stream
    config = replace(engine_config, max_num_blocks=8)
    engine = ASREngine(config)
    events = Collector()
    audio = speech[2]  # 11 s
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, audio))
    run_until_idle(engine)
    done = events.done(1)
    assert done.finish_reason == "length"
    finals = events.of_type(1, Final)
    partials = events.of_type(1, Partial)
    if partials:
        assert [f.text for f in finals] == [partials[-1].text]
        assert finals[0].reason == "length"
    assert engine.stats.finish_reasons["length"] == 1
    assert_pool_full(engine)


def test_eviction_counts_match_geometry(engine_config: EngineConfig,
                                        speech: list[np.ndarray]) -> None:
    config = replace(engine_config, num_left_chunks=2)
    engine = ASREngine(config)
    audio = speech[2]
    events = stream_all(engine, audio)
    run_until_idle(engine)
    num_fbank = 1 + (len(audio) - 400) // 160
    num_chunks = len(range(0, num_fbank - 7 + 1, 64))
    # one block per chunk; a commit leaves at most 2 blocks, evicting the oldest
    assert engine.resources.attention.num_evictions == num_chunks - 2
    assert events.done(1).finish_reason == "stop"
    assert_pool_full(engine)


def test_busy_refusal_when_no_slot_and_no_wait(engine_config: EngineConfig,
                                               speech: list[np.ndarray]) -> None:
    engine = ASREngine(replace(engine_config, max_batch_size=1, max_wait_time_s=0.0))
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.step()
    engine.submit(OpenStream(2, events.sink(2)))
    engine.step()
    errors = events.of_type(2, Error)
    assert [e.code for e in errors] == ["busy"]
    assert events.of_type(2, Ready) == []
    assert events.of_type(1, Ready)
    engine.submit(AbortStream(1))
    run_until_idle(engine)
    assert engine.stats.num_refused == 1
    assert_pool_full(engine)


def test_waiting_stream_is_admitted_when_a_slot_frees(engine_config: EngineConfig,
                                                      speech: list[np.ndarray]) -> None:
    engine = ASREngine(replace(engine_config, max_batch_size=1))
    events = Collector()
    for sid in (1, 2):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, speech[sid - 1]))
        engine.submit(EndStream(sid))
    engine.step()
    assert engine.scheduler.waiting == type(engine.scheduler.waiting)([2])
    run_until_idle(engine)
    alone = transcribe_alone(engine_config, speech[1])
    assert events.done(2).finish_reason == "stop"
    assert events.finals(2) == alone.finals(1)
    ready_2 = events.events[2].index(events.of_type(2, Ready)[0])
    assert ready_2 == 0
    assert_pool_full(engine)


def test_idle_timeout_and_abort(engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    engine = ASREngine(replace(engine_config, idle_timeout_s=0.0))
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    run_until_idle(engine)
    assert events.done(1).finish_reason == "timeout"

    engine = ASREngine(engine_config)
    engine.submit(OpenStream(2, events.sink(2)))
    engine.submit(AppendAudio(2, speech[0][:32000]))
    engine.step()
    engine.step()
    engine.submit(AbortStream(2))
    run_until_idle(engine)
    assert events.done(2).finish_reason == "abort"
    assert events.of_type(2, Final) == []
    assert_pool_full(engine)


def test_failure_in_one_stream_leaves_the_others_correct(engine_config: EngineConfig,
                                                         speech: list[np.ndarray]) -> None:
    alone = [transcribe_alone(engine_config, audio) for audio in speech[:3]]
    engine = ASREngine(engine_config)
    forward = engine.resources.runner.forward

    def failing_forward(plan):  # type: ignore[no-untyped-def]
        if 2 in plan.stream_ids and plan.windows[plan.stream_ids.index(2)].index == 3:
            raise RuntimeError("injected failure")
        return forward(plan)

    engine.resources.runner.forward = failing_forward  # type: ignore[method-assign]
    events = Collector()
    for sid, audio in enumerate(speech[:3], start=1):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    run_until_idle(engine)
    assert events.done(2).finish_reason == "error"
    assert [e.code for e in events.of_type(2, Error)] == ["internal"]
    for sid in (1, 3):
        assert events.done(sid).finish_reason == "stop"
        assert events.finals(sid) == alone[sid - 1].finals(1)
    assert_pool_full(engine)


def _silence_is_blank(engine: ASREngine) -> None:
    """Make the random model behave like a trained one on silence: a chunk whose fbank is
    near the log floor (digital silence) emits only blanks. Speech chunks keep the model's own
    (random, mostly non-blank) outputs, so endpointing sees speech, then trailing silence."""
    forward = engine.resources.runner.forward

    def forward_with_blank_silence(plan):  # type: ignore[no-untyped-def]
        out = forward(plan)
        with torch.inference_mode():
            for row, window in enumerate(plan.windows):
                if float(window.feats.mean()) < -10.0:
                    out.log_probs[row] = -1e4
                    out.log_probs[row, :, 0] = 0.0
        return out

    engine.resources.runner.forward = forward_with_blank_silence  # type: ignore[method-assign]


def test_endpoint_finalises_segment_and_resets_the_stream(engine_config: EngineConfig,
                                                          speech: list[np.ndarray]) -> None:
    # speech, 3 s of digital silence, speech: rule 4 (1.2 s of silence after speech) fires once
    silence = np.zeros(48000, dtype=np.float32)
    audio = np.concatenate([speech[0], silence, speech[1]])
    endpoint = EndpointConfig(rule1=None, rule2=None, rule3=None)
    engine = ASREngine(replace(engine_config, endpoint=endpoint))
    _silence_is_blank(engine)
    events = stream_all(engine, audio)
    blocks_seen = []
    engine.step()
    while engine.requests:
        blocks_seen.append(engine.resources.attention.num_cached_frames(1))
        engine.step()
    finals = events.of_type(1, Final)
    assert [f.reason for f in finals] == ["endpoint", "stop"]
    assert [f.segment for f in finals] == [0, 1]
    assert finals[0].end <= finals[1].start
    assert finals[0].start < len(speech[0]) / 16000 < finals[1].start
    assert dict(engine.stats.endpoints) == {"rule4": 1}
    # the reset rewound the attention history in place: it dropped back to one chunk
    drops = [b for a, b in zip(blocks_seen, blocks_seen[1:], strict=False) if b < a]
    assert drops and min(drops) <= engine.resources.chunk_size
    assert events.done(1).num_segments == 2
    assert_pool_full(engine)


def test_a_final_says_how_much_audio_the_server_had_when_it_ended_the_segment(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    # fed in 0.1 s pieces, a step after each: the endpoint's final is published during the
    # step after some piece, and its decided_at is the audio received by then, at least the
    # rule's 1.2 s of silence after the last word; the stop's final is decided at the end
    audio = np.concatenate([speech[0], np.zeros(48000, np.float32), speech[1]])
    endpoint = EndpointConfig(rule1=None, rule2=None, rule3=None)
    engine = ASREngine(replace(engine_config, endpoint=endpoint))
    _silence_is_blank(engine)
    received: list[tuple[Final, float]] = []
    sent = [0]
    engine.submit(OpenStream(1, lambda event: received.append((event, sent[0] / 16000))
                             if isinstance(event, Final) else None))
    for start in range(0, len(audio), 1600):
        engine.submit(AppendAudio(1, audio[start:start + 1600]))
        sent[0] = min(start + 1600, len(audio))
        engine.step()
    engine.submit(EndStream(1))
    run_until_idle(engine)
    (pause, at_pause), (stop, _) = received
    assert (pause.reason, stop.reason) == ("endpoint", "stop")
    assert pause.decided_at == pytest.approx(at_pause)
    assert pause.decided_at >= pause.end + 1.2
    assert pause.decided_at < len(speech[0]) / 16000 + 3.0  # inside the silence
    assert stop.decided_at == pytest.approx(len(audio) / 16000)
    assert pause.to_json()["decided_at"] == round(pause.decided_at, 3)


def test_too_much_pending_audio_is_an_error_for_that_stream(engine_config: EngineConfig) -> None:
    engine = ASREngine(replace(engine_config, max_pending_audio_s=2.0))
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, np.zeros(48000, dtype=np.float32)))
    run_until_idle(engine)
    assert [e.code for e in events.of_type(1, Error)] == ["too_much_audio"]
    assert events.done(1).finish_reason == "error"
    assert_pool_full(engine)


def test_engine_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="block_size_frames must be >= 1"):
        EngineConfig(block_size_frames=0, chunk_size=16)
    # any block size serves any chunk (eviction is by frame): two blocks per chunk here
    cache = cache_config_for(EngineConfig(block_size_frames=8, num_left_chunks=2),
                             ConformerConfig(), torch.device("cpu"), torch.float32, chunk_size=32)
    assert cache.peak_blocks_per_stream == 3 * 32 // 8 and cache.max_num_blocks == 64 * 12
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        EngineConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="device must be"):
        EngineConfig(device="tpu")
    with pytest.raises(ValueError, match="max_wait_time_s=-1.0: it must be >= 0"):
        EngineConfig(max_wait_time_s=-1.0)
    assert EngineConfig(max_wait_time_s=math.inf).max_wait_time_s == math.inf


def test_the_live_policy_gets_a_step_s_messages_joined_once(engine_config: EngineConfig,
                                                           speech: list[np.ndarray]) -> None:
    """A client's 100 ms messages reach the live policy (energies, the second pass's audio,
    the pace) once a step, joined in order: the energies are those of the audio appended whole,
    and no message is lost or repeated."""
    engine = ASREngine(engine_config)
    engine.submit(OpenStream(1, lambda event: None))
    engine.step()
    calls: list[int] = []
    on_audio = engine.live.on_audio
    engine.live.on_audio = lambda fed, now: (  # type: ignore[method-assign]
        calls.extend(len(samples) for _, samples in fed), on_audio(fed, now))
    audio = speech[0][: 16000 * 2]
    for step_start in range(0, len(audio), 10240):
        for at in range(step_start, min(step_start + 10240, len(audio)), 1600):
            engine.submit(AppendAudio(1, audio[at : min(at + 1600, step_start + 10240)]))
        engine.step()
    assert calls == [10240, 10240, 10240, 1280]  # one call a step, 6-7 messages each
    whole = FrameEnergy(engine.live.timing.samples_per_frame)
    whole.append(audio)
    held = engine.live.streams[1].energy  # (the frames before a rewind's reach are let go)
    assert held.num_frames == whole.num_frames == len(audio) // whole.samples_per_frame
    np.testing.assert_array_equal(held.values, whole.span(held.first_frame, whole.num_frames))


# In a process of its own: whether the word times' search is compiled is process-wide.
_BUILT_THEN_ASKED = textwrap.dedent("""
    import sys
    from oasr.engine import ASREngine, EngineConfig
    from oasr.engine.live import posteriors
    assert not posteriors._window_peaks.signatures  # nothing compiled it yet
    ASREngine(EngineConfig(model=sys.argv[1], device="cpu", max_batch_size=1, max_num_blocks=8))
    print(len(posteriors._window_peaks.signatures))
""")


def test_building_an_engine_compiles_the_word_times_search(tiny_model_dir) -> None:
    """The first partial would otherwise compile it (or load numba and its cache, 0.4-0.8 s)
    inside a step, holding up every stream's text."""
    out = subprocess.run([sys.executable, "-c", _BUILT_THEN_ASKED, str(tiny_model_dir)],
                         check=True, capture_output=True, text=True, timeout=120)
    assert int(out.stdout.split()[-1]) == 1


def test_an_engine_on_the_cpu_names_the_cpu_and_its_kernel_features_in_its_log(
        engine_config: EngineConfig, caplog: pytest.LogCaptureFixture) -> None:
    """A log read later (a slow step, a dtype warning) says which CPU the numbers came from."""
    import oasr.cpu as cpu_facts

    with caplog.at_level(logging.INFO, logger="oasr.engine.runner.streams"):
        ASREngine(engine_config)
    named = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine: CPU ")]
    assert named == [f"engine: CPU {cpu_facts.summary(cpu_facts.describe())}"]
    assert all(flag in named[0] for flag in cpu_facts.describe()["cpu_features"])
