"""The Whisper second pass's cost for one 5 s segment on this machine."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from oasr.audio import MODEL_SAMPLE_RATE, read_audio

SEGMENT_S = 5.0
SEGMENT_FILE = "real_jfk.wav"  # real speech, longer than the segment


def measure_second_pass(audio_dir: Path, device: str | None = None,
                        repeats: int = 3) -> dict[str, Any] | None:
    """Stage times (median of ``repeats``) for a 5 s real-speech segment; None without Whisper.

    ``device`` is a torch device string, or None / ``"auto"`` for CUDA when present.
    """
    try:
        from oasr.models.whisper import load_whisper
        from oasr.models.whisper.timing import time_second_pass
        from oasr.models.whisper.transcriber import WhisperTranscriber

        checkpoint = load_whisper(device=None if device == "auto" else device)
    except (ImportError, FileNotFoundError):
        return None
    audio = read_audio(audio_dir / SEGMENT_FILE)[: int(SEGMENT_S * MODEL_SAMPLE_RATE)]
    timing = time_second_pass(WhisperTranscriber(checkpoint), audio, repeats=repeats)
    return asdict(timing) | {"real_time_factor": timing.real_time_factor}
