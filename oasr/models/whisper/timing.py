"""Wall-clock cost of the Whisper second pass on one segment, stage by stage (for benches)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from oasr.models.whisper.transcriber import WhisperTranscriber


@dataclass(frozen=True)
class SecondPassTiming:
    """Median seconds per stage over the timed repeats (the first, warm-up run is not timed).

    Attributes:
        audio_seconds: length of the segment.
        frontend_s, encoder_s, decoder_s: log-mel, encoder, and cross K/V + greedy decoding.
        total_s: the three together.
        num_tokens: tokens generated (end token included).
        text: the transcript.
        encoder_frames: mel frames the encoder ran on (3000 = the whole 30 s window).
    """

    audio_seconds: float
    frontend_s: float
    encoder_s: float
    decoder_s: float
    total_s: float
    num_tokens: int
    text: str
    encoder_frames: int = 3000

    @property
    def real_time_factor(self) -> float:
        return self.total_s / self.audio_seconds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_second_pass(
    transcriber: WhisperTranscriber, waveform: torch.Tensor | np.ndarray, repeats: int = 3
) -> SecondPassTiming:
    """Time one segment through ``transcriber`` (its encoder window): frontend, encoder,
    decoding (medians)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    model = transcriber.checkpoint.model
    samples = np.asarray(waveform).shape[-1]
    transcriber.encoder.silence_cross_kv()  # computed once per model, not per segment
    runs = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        groups = transcriber.encoder.features([waveform])
        _sync(model.device)
        t1 = time.perf_counter()
        encoded = transcriber.encoder.encode_features(groups)
        _sync(model.device)
        t2 = time.perf_counter()
        result = transcriber.decode_encoded(encoded.states, encoded.num_encoded)[0]
        _sync(model.device)
        runs.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    front, enc, dec = (statistics.median(stage) for stage in zip(*runs[1:], strict=True))
    return SecondPassTiming(samples / 16000, front, enc, dec, front + enc + dec,
                            len(result.tokens) + 1, result.text, groups[0].mel.size(-1))
