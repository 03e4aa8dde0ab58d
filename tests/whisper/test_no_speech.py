"""Segments with no speech get "" from the second pass, not Whisper's "you": the loudness gate,
the no-speech rule, the worker on silence and noise, and a whole engine stream of noise."""

from __future__ import annotations

import math
import queue
from pathlib import Path

import numpy as np
import pytest
import torch

from oasr.engine import ASREngine, EngineConfig, Final
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.second_pass.worker import SecondPassDone, SecondPassJob, SecondPassWorker
from oasr.models import AsrModel, ConformerConfig, save_model
from oasr.models.whisper import WhisperCheckpoint
from oasr.models.whisper.continuous import ContinuousWhisperDecoder
from oasr.models.whisper.no_speech import NoSpeechRule
from oasr.models.whisper.transcriber import WhisperTranscriber
from oasr.text.wer import word_error_rate

RATE = 16000


def _noise(seconds: float, dbfs: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * RATE)) * 10 ** (dbfs / 20)).astype(np.float32)


def _hum(seconds: float, amplitude: float = 0.05) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * math.pi * 50.0 * t)).astype(np.float32)


def test_loudness_gate_looks_at_the_loudest_window() -> None:
    rule = NoSpeechRule()
    tone = np.sin(2 * math.pi * 440.0 * np.arange(RATE) / RATE).astype(np.float32)
    assert rule.loudest_dbfs(0.1 * tone) == pytest.approx(-23.01, abs=0.05)  # 0.1 / sqrt(2)
    burst = np.zeros(10 * RATE, dtype=np.float32)
    burst[RATE : RATE + 1600] = 0.03 * tone[:1600]  # 0.1 s at -33.5 dBFS in 10 s of silence
    global_rms = 10 * math.log10(float(np.mean(np.square(burst))))
    assert global_rms < -45.0 < rule.loudest_dbfs(burst)  # a global RMS would call it silent
    assert rule.has_voice(burst) and rule.has_voice(torch.from_numpy(burst))
    assert not rule.has_voice(_noise(2.0, -60.0, seed=1))
    assert rule.loudest_dbfs(np.zeros(100)) == float("-inf")
    assert rule.loudest_dbfs(np.zeros(0)) == float("-inf") and not rule.has_voice(np.zeros(0))
    assert rule.loudest_dbfs(0.1 * tone[:400]) == pytest.approx(-23.0, abs=0.1)  # < one window


def test_no_speech_decision() -> None:
    rule = NoSpeechRule()
    assert rule.is_no_speech(0.948, -0.38)  # tiny.en's confident "you" on digital silence
    assert rule.is_no_speech(0.7, -1.2)  # Whisper's own rule
    assert not rule.is_no_speech(0.7, -0.5)  # unsure, but the text is confident
    assert not rule.is_no_speech(0.42, -1.31)  # a 0.7 s cut holding one spoken digit
    assert not rule.is_no_speech(None, -5.0)  # no no-speech token in the vocabulary
    with pytest.raises(ValueError, match="no_speech_prob is a probability in 0..1, got 1.5"):
        NoSpeechRule(no_speech_prob=1.5)
    with pytest.raises(ValueError, match=r"confident_no_speech_prob \(0.5\) must be >= "):
        NoSpeechRule(confident_no_speech_prob=0.5)
    with pytest.raises(ValueError, match="voice_window_s must be > 0, got 0"):
        NoSpeechRule(voice_window_s=0.0)


@pytest.mark.slow
def test_whisper_hallucinates_on_silence_and_noise_and_the_rule_catches_it(
        checkpoint: WhisperCheckpoint, recordings) -> None:
    cases = {"silence": np.zeros(2 * RATE, dtype=np.float32), "hiss": _noise(3.0, -30.0, 2),
             "hum": _hum(3.0)}
    raw = WhisperTranscriber(checkpoint).transcribe(list(cases.values()))
    print({name: (r.text, round(r.no_speech_prob or 0, 3), round(r.avg_log_prob, 2))
           for name, r in zip(cases, raw, strict=True)})
    assert all(r.text for r in raw), "Whisper no longer hallucinates here; revisit the rule"
    rule = NoSpeechRule()
    assert all(rule.is_no_speech(r.no_speech_prob, r.avg_log_prob) for r in raw)
    speech = WhisperTranscriber(checkpoint).transcribe([r.waveform for r in recordings[:6]])
    assert not any(rule.is_no_speech(r.no_speech_prob, r.avg_log_prob) for r in speech)


def _collect(worker_out: queue.Queue[SecondPassDone], count: int) -> dict[int, SecondPassDone]:
    done = {}
    for _ in range(count):
        item = worker_out.get(timeout=120)
        done[item.job_id] = item
    return done


@pytest.mark.slow
def test_worker_answers_silence_and_noise_with_empty_text(checkpoint: WhisperCheckpoint,
                                                          recordings) -> None:
    out: queue.Queue[SecondPassDone] = queue.Queue()
    decoder = ContinuousWhisperDecoder(checkpoint)
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8)
    speech = next(r for r in recordings if r.name == "real_jackson_4.wav")
    segments = {1: np.zeros(RATE, dtype=np.float32), 2: _noise(2.0, -55.0, 3),
                3: _noise(2.0, -30.0, 4), 4: _hum(2.0), 5: speech.waveform.numpy()}
    try:
        for job_id, audio in segments.items():
            assert worker.try_submit(SecondPassJob(job_id, 7, job_id, audio, 0.0))
        done = _collect(out, len(segments))
    finally:
        worker.stop()
    assert {i: done[i].text for i in (1, 2, 3, 4)} == {1: "", 2: "", 3: "", 4: ""}
    assert word_error_rate(speech.reference, done[5].text or "") <= 1 / 6
    assert (worker.num_no_voice, worker.num_no_speech) == (2, 2)  # 1, 2 not decoded; 3, 4 were
    assert worker.backlog == 0
    assert decoder.manager.pool.num_free_blocks == decoder.manager.pool.num_blocks


def _tiny_ctc_dir(root: Path) -> Path:
    """A seeded random Conformer-CTC: it writes letters for any audio, noise included."""
    torch.manual_seed(0)
    units = ["<blank>", "<unk>", "'", *"abcdefghijklmnopqrstuvwxyz", "\u2581", "<sos/eos>"]
    config = ConformerConfig(vocab_size=len(units), output_size=32, attention_heads=2,
                             linear_units=64, num_blocks=2, cnn_module_kernel=7)
    return save_model(AsrModel(config, units=units).eval(), root)


@pytest.mark.slow
def test_engine_streams_of_noise_get_no_hallucinated_final(checkpoint: WhisperCheckpoint,
                                                           tmp_path: Path) -> None:
    config = EngineConfig(model=str(_tiny_ctc_dir(tmp_path)), device="cpu", max_batch_size=4,
                          max_num_blocks=128, max_wait_time_s=math.inf, endpoint=None,
                          second_pass="whisper")
    engine = ASREngine(config)
    finals: dict[int, list[str]] = {1: [], 2: []}
    sources: dict[int, list[str]] = {1: [], 2: []}

    def sink(sid: int):  # type: ignore[no-untyped-def]
        def put(event) -> None:  # type: ignore[no-untyped-def]
            if isinstance(event, Final):
                finals[sid].append(event.text)
                sources[sid].append(event.source)
        return put

    for sid, audio in ((1, _noise(2.0, -35.0, 5)), (2, _hum(2.0))):
        engine.submit(OpenStream(sid, sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    engine.step()
    for _ in range(20_000):
        if engine.is_idle:
            break
        if not engine.step():
            engine.wait_for_work(0.05)
    engine.shutdown()
    assert engine.is_idle
    assert sources == {1: ["whisper"], 2: ["whisper"]}  # the segments did reach Whisper
    assert finals == {1: [""], 2: [""]}
    second = engine.stats.snapshot.second_pass
    assert second.num_no_voice + second.num_no_speech == 2, second
