"""A stream's own silence-after-speech endpoint (what the realtime socket's server VAD sets)."""

from __future__ import annotations

import pytest

from oasr.decoding import EndpointConfig
from oasr.decoding.decoder import FrameStats
from oasr.engine import EngineConfig
from oasr.engine.commands import OpenStream
from oasr.engine.engine import ASREngine
from oasr.engine.thread import EngineThread


def test_open_stream_with_its_own_silence_rule(engine_config: EngineConfig) -> None:
    engine = ASREngine(engine_config)  # the engine's own endpointing is off (endpoint=None)
    engine.submit(OpenStream(1, lambda event: None, endpoint_silence_s=0.4))
    engine.submit(OpenStream(2, lambda event: None))
    engine.step()
    own, default = engine.live.endpointer(1), engine.live.endpointer(2)
    assert default is None
    assert own is not None and own.config.rule2 is not None
    assert own.config.rule2.min_trailing_silence_s == 0.4
    assert own.config.frame_shift_s == engine.family.timing.frame_shift_s  # 40 ms frames
    # 10 blank frames (0.4 s) after speech end the segment by rule 2; 9 do not
    assert own.detect(FrameStats(40, 10, has_speech=True)) == "rule2"
    assert own.detect(FrameStats(40, 9, has_speech=True)) is None
    assert own.detect(FrameStats(40, 10, has_speech=False)) is None
    engine.shutdown()


def test_the_other_rules_stay_the_engines(engine_config: EngineConfig) -> None:
    config = EngineConfig(**{**engine_config.__dict__, "endpoint": EndpointConfig()})
    engine = ASREngine(config)
    endpointer = engine.resources.endpointer_with_silence(2.5)
    assert endpointer.config.rule1 == engine.resources.endpointer.config.rule1
    assert endpointer.config.rule3 == engine.resources.endpointer.config.rule3
    assert endpointer.config.rule2.min_trailing_silence_s == 2.5
    engine.shutdown()


@pytest.mark.parametrize("silence_s", [0.0, -1.0, 61.0])
def test_thread_rejects_absurd_silences(engine_config: EngineConfig, silence_s: float) -> None:
    thread = EngineThread(engine_config)
    with pytest.raises(ValueError, match="endpoint silence"):
        thread.open_stream(16000, "s16le", endpoint_silence_s=silence_s)
    thread.engine.shutdown()
