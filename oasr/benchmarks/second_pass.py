"""The Whisper second pass's cost for one 5 s segment on this machine, with the encoder on the
segment's window (the default: segment + 2 s margin, 2 s buckets) and on the whole 30 s window."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from oasr.audio import MODEL_SAMPLE_RATE, read_audio

SEGMENT_S = 5.0
SEGMENT_FILE = "real_jfk.wav"  # real speech, longer than the segment
MEL_FRAME_S = 0.01  # the second pass's log-mel hop


def measure_second_pass(audio_dir: Path, device: str | None = None, repeats: int = 3,
                        full_window: bool = True) -> dict[str, Any] | None:
    """Stage times (median of ``repeats``) for a 5 s real-speech segment; None without Whisper.

    ``device`` is a torch device string, or None / ``"auto"`` for CUDA when present. The
    result's ``encoder_frames`` are the mel frames the encoder ran on (``encoder_window_s`` in
    seconds); with ``full_window`` it also holds ``full_window``: the same timing with the
    encoder on the whole 30 s window (`EncoderWindow(mode="full")`).
    """
    try:
        from oasr.models.whisper import EncoderWindow, load_whisper
        from oasr.models.whisper.timing import time_second_pass
        from oasr.models.whisper.transcriber import WhisperDecodeConfig, WhisperTranscriber

        checkpoint = load_whisper(device=None if device == "auto" else device)
    except (ImportError, FileNotFoundError):
        return None
    audio = read_audio(audio_dir / SEGMENT_FILE)[: int(SEGMENT_S * MODEL_SAMPLE_RATE)]

    def timed(window: EncoderWindow | None) -> dict[str, Any]:
        config = WhisperDecodeConfig() if window is None else WhisperDecodeConfig(
            encoder_window=window)
        timing = time_second_pass(WhisperTranscriber(checkpoint, config), audio, repeats=repeats)
        return asdict(timing) | {"real_time_factor": timing.real_time_factor,
                                 "encoder_window_s": round(timing.encoder_frames * MEL_FRAME_S, 2)}

    result = timed(None)
    if full_window:
        result["full_window"] = timed(EncoderWindow(mode="full"))
    return result
