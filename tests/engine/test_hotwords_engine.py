"""Hotwords through the engine: carried from OpenStream to the stream's decoder state and its
second-pass jobs, replaced by SetHotwords from the next chunk on, echoed by ready; and every
partial and final carries its words, in order, inside its segment."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from oasr.decoding import GpuDecoderConfig
from oasr.decoding.context import HotwordError, Hotwords
from oasr.engine import ASREngine, EngineConfig, EngineThread, Final, Partial, Ready
from oasr.engine.commands import AppendAudio, EndStream, OpenStream, SetHotwords
from tests.engine.engine_helpers import Collector


@pytest.fixture()
def beam_config(engine_config: EngineConfig) -> EngineConfig:
    return dataclasses.replace(engine_config, decoder=GpuDecoderConfig(beam_size=4))


def _hotwords(engine: ASREngine, terms: list[object], prompt: str = "") -> Hotwords:
    return Hotwords.build(terms, engine.resources.hotword_tokenizer, prompt)


def _context(engine: ASREngine, stream_id: int):
    return engine.resources.ctc.get_state(stream_id).context


def test_ready_echoes_the_hotwords_and_the_stream_is_searched_with_them(
        beam_config: EngineConfig, speech: list[np.ndarray]) -> None:
    engine, events = ASREngine(beam_config), Collector()
    hot = _hotwords(engine, ["Brenvik", {"phrase": "Taloria", "boost": 4.5}])
    engine.submit(OpenStream(1, events.sink(1), hotwords=hot))
    engine.submit(OpenStream(2, events.sink(2)))
    engine.step()
    ready = events.of_type(1, Ready)[0]
    assert ready.to_json()["hotwords"] == [{"phrase": "Brenvik", "boost": 3.0},
                                           {"phrase": "Taloria", "boost": 4.5}]
    assert events.of_type(2, Ready)[0].to_json()["hotwords"] == []
    assert _context(engine, 1) is hot.graph and _context(engine, 2) is None
    assert engine.live.streams[1].prompt == "Glossary: Brenvik, Taloria."
    engine.shutdown()


def test_new_hotwords_apply_from_the_next_chunk(beam_config: EngineConfig,
                                                speech: list[np.ndarray]) -> None:
    engine, events = ASREngine(beam_config), Collector()
    first = _hotwords(engine, ["Brenvik"])
    engine.submit(OpenStream(1, events.sink(1), hotwords=first))
    engine.submit(AppendAudio(1, speech[0]))
    engine.step()
    engine.step()  # a chunk decoded with the first graph
    assert _context(engine, 1) is first.graph
    second = _hotwords(engine, ["Quenmarsh"], prompt="Street names.")
    engine.submit(SetHotwords(1, second))
    decoded = engine.requests[1].num_frames_decoded
    engine.step()  # the command is applied before this step's chunk
    assert engine.requests[1].num_frames_decoded > decoded
    assert _context(engine, 1) is second.graph
    assert engine.live.streams[1].prompt == "Street names. Glossary: Quenmarsh."
    engine.submit(SetHotwords(1, _hotwords(engine, [])))
    engine.step()
    assert _context(engine, 1) is None
    engine.shutdown()


def test_a_waiting_stream_gets_its_new_hotwords_when_admitted(beam_config: EngineConfig) -> None:
    config = dataclasses.replace(beam_config, max_batch_size=1)
    engine, events = ASREngine(config), Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(OpenStream(2, events.sink(2), hotwords=_hotwords(engine, ["Brenvik"])))
    engine.step()
    assert not events.of_type(2, Ready)  # no slot yet
    later = _hotwords(engine, ["Taloria"])
    engine.submit(SetHotwords(2, later))
    engine.submit(EndStream(1))
    for _ in range(10):
        engine.step()
        if events.of_type(2, Ready):
            break
    assert [h.phrase for h in events.of_type(2, Ready)[0].hotwords] == ["Taloria"]
    assert _context(engine, 2) is later.graph
    engine.shutdown()


def test_partials_and_finals_carry_their_words_in_order_inside_the_segment(
        speech: list[np.ndarray]) -> None:
    # the bundled model (the tiny random one writes no words), CTC finals, real speech
    config = EngineConfig(max_batch_size=1, max_num_blocks=64, num_threads=1,
                          second_pass="none", decoder=GpuDecoderConfig(beam_size=4))
    engine, events = ASREngine(config), Collector()
    engine.submit(OpenStream(1, events.sink(1), hotwords=_hotwords(engine, ["Brenvik"])))
    engine.submit(AppendAudio(1, speech[2]))
    engine.submit(EndStream(1))
    engine.step()
    while not engine.is_idle:
        engine.step()
    partials, finals = events.of_type(1, Partial), events.of_type(1, Final)
    assert finals and any(p.words for p in partials)
    for event in [*partials, *finals]:
        assert [w.word for w in event.words] == event.text.split()
        ends = [0.0] + [w.end for w in event.words]
        assert all(w.start >= before - 1e-9 and w.end >= w.start
                   for w, before in zip(event.words, ends, strict=False))
        assert all(0.0 <= w.confidence <= 1.0 for w in event.words)
    for final in finals:
        assert all(final.start - 1e-9 <= w.start and w.end <= final.end + 1e-9
                   for w in final.words)
    for partial in partials:
        assert all(w.end <= partial.end + 1e-9 for w in partial.words)
    engine.shutdown()


def test_the_thread_api_checks_hotwords_and_fails_only_that_call(
        beam_config: EngineConfig) -> None:
    thread = EngineThread(beam_config)
    thread.start()
    try:
        with pytest.raises(HotwordError, match="cannot write '2'"):
            thread.open_stream(sink=lambda e: None, hotwords=["R2D2"])
        stream = thread.open_stream(sink=lambda e: None, hotwords=["Brenvik"])
        with pytest.raises(HotwordError, match="at most 100"):
            thread.set_hotwords(stream, [f"w{i}" for i in range(101)])
        accepted = thread.set_hotwords(stream, [{"phrase": "Taloria", "boost": 5}])
        assert accepted.to_json() == [{"phrase": "Taloria", "boost": 5.0}]
        thread.abort_stream(stream)
        with pytest.raises(KeyError):
            thread.set_hotwords(10_000, ["x"])
    finally:
        thread.stop()


def test_greedy_search_takes_hotwords_into_the_second_pass_only(
        engine_config: EngineConfig) -> None:
    engine = ASREngine(engine_config)  # beam 1
    assert engine.resources.hotword_tokenizer is None
    hot = _hotwords(engine, ["Brenvik"])
    assert hot.graph is None and hot.whisper_prompt() == "Glossary: Brenvik."
    engine.shutdown()


def test_offline_transcription_takes_hotwords(beam_config: EngineConfig, tmp_path: Path) -> None:
    from oasr.engine.offline import transcribe_files

    with pytest.raises(HotwordError, match="boost"):
        transcribe_files(beam_config, [], progress=False,
                         hotwords=[{"phrase": "x", "boost": -1}])
