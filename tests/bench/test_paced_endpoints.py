"""bench/paced_endpoints.py feeds audio as a live client sends it: a pause is decided between
chunks only when the audio comes in pieces (a harness that handed over whole files, as
``oasr transcribe`` does, would measure the chunk rule under both names)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from oasr.audio import read_audio
from oasr.engine import EngineConfig
from oasr.engine.live.quiet_tail import QuietTail
from oasr.models.checkpoint import DEFAULT_MODEL_DIR

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the script imports its siblings by name

import paced_endpoints  # noqa: E402


@pytest.mark.slow
def test_paced_audio_ends_segments_between_chunks_only_with_the_quiet_rule(
        audio_dir: Path, tmp_path: Path) -> None:
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("the bundled default model is not installed")
    first, second = (read_audio(audio_dir / name) for name in ("tts_00.wav", "tts_01.wav"))
    silence = np.zeros(int(1.6 * 16000), np.float32)
    path = tmp_path / "two.wav"
    sf.write(path, np.concatenate([first, silence, second, silence]), 16000)
    item = paced_endpoints.Item(path, "two", "the weather is nice today so we will walk to "
                                "the park turn the volume down a little bit please")
    base = replace(paced_endpoints.engine_config("none", EngineConfig().second_pass_decode,
                                                 None, 1, context_s=0.0), min_audio_rate=0.0)
    at_chunks = paced_endpoints.run_paced([item], replace(base, endpoint_quiet=None), "chunks")
    between = paced_endpoints.run_paced([item], replace(base, endpoint_quiet=QuietTail()),
                                        "between")
    assert at_chunks["between_chunks"] == 0
    assert between["between_chunks"] >= 1  # the 1.6 s pause, heard on the quiet pieces
    for column in ("chunks", "between"):
        assert item.results[column]["segments"] == 2  # each sentence its own segment
        assert "weather" in item.results[column]["text"]
