"""The Whisper second pass's cost on this machine: a burst of finals decoded together as the
server decodes them (`measure_finals_burst`), and one 5 s segment's stages with the encoder on
the segment's window (the default: segment + 2 s margin, 0.5 s buckets) and on the whole 30 s
window (`measure_second_pass`)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.engine import EngineConfig

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


BURST_SEGMENTS = 8  # finals that end together, as when several speakers finish a sentence
BURST_SEGMENT_S = 5.0


def burst_segments(audio_dir: Path) -> list[np.ndarray]:
    """The first `BURST_SEGMENT_S` of the `BURST_SEGMENTS` longest recordings in
    ``audio_dir`` (the dev set's read sentences, not its short digit strings), the longest
    again where there are fewer."""
    waves = sorted((read_audio(f) for f in sorted(audio_dir.glob("*.wav"))), key=len,
                   reverse=True)
    if not waves:
        raise FileNotFoundError(f"no .wav files in {audio_dir}")
    n = int(BURST_SEGMENT_S * MODEL_SAMPLE_RATE)
    return [waves[i % len(waves)][:n] for i in range(BURST_SEGMENTS)]


def decode_together(decoder: Any, waves: list[np.ndarray], fast: bool = False) -> list[Any]:
    """Submit ``waves`` at once to ``decoder`` (a `ContinuousWhisperDecoder`; request ids
    0..N-1; ``fast``: greedy on each segment's own window, as a busy server decodes finals)
    and step it until every final is out: their `SecondPassResult`s in submission order."""
    for i, wave in enumerate(waves):
        decoder.submit(i, torch.from_numpy(np.ascontiguousarray(wave)), fast=fast)
    results = []
    while decoder.has_work():
        results += decoder.step()
    return sorted(results, key=lambda r: r.request_id)


def measure_finals_burst(audio_dir: Path, device: str | None = None, threads: int = 1,
                         repeats: int = 2) -> dict[str, Any] | None:
    """Finals decoded together as the server's second pass decodes them: `BURST_SEGMENTS`
    segments of `BURST_SEGMENT_S` of speech (`burst_segments`) submitted at once to one
    decoder with the server's settings (`EngineConfig.second_pass_decode`: beam 5, int8
    logits, the served dtype) on ``threads`` torch threads (one second-pass process's), once
    as an idle server decodes finals (``beam``: beam search) and once as a busy one does
    (``greedy``: greedy on each segment's own window). Each gives the seconds the burst took
    (median of ``repeats`` after one untimed) and ``audio_s_per_s``, the audio seconds it
    cleared per second: what one process's share of the finals can take before they queue.
    None without Whisper."""
    try:
        from oasr.models.whisper.continuous import ContinuousWhisperDecoder
        from oasr.models.whisper.transcriber import load_for_decoding

        config = EngineConfig().second_pass_decode
        checkpoint = load_for_decoding(config, None if device in (None, "auto") else device)
    except (ImportError, FileNotFoundError):
        return None
    segments = burst_segments(audio_dir)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        decoder = ContinuousWhisperDecoder(checkpoint, config)

        def burst(fast: bool) -> float:
            start = time.perf_counter()
            decode_together(decoder, segments, fast)
            return time.perf_counter() - start

        audio_s = BURST_SEGMENTS * BURST_SEGMENT_S
        result: dict[str, Any] = {"segments": BURST_SEGMENTS, "segment_s": BURST_SEGMENT_S,
                                  "threads": threads, "dtype": str(checkpoint.model.dtype)}
        for name, fast in (("beam", False), ("greedy", True)):
            burst(fast)  # untimed: the first decode of these shapes
            seconds = round(statistics.median(burst(fast) for _ in range(repeats)), 3)
            # the rate of the seconds reported, so that the two agree to their last digit
            result[name] = {"seconds": seconds, "audio_s_per_s": round(audio_s / seconds, 1)}
        return result
    finally:
        torch.set_num_threads(before)
