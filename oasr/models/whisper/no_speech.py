"""When a segment holds no speech, so that Whisper's text for it is a hallucination.

On silence and noise Whisper tiny.en writes "you" (or "Thank you.") rather than nothing. The
rule that catches it has two parts. Before decoding: a segment whose loudest 100 ms is below
-45 dBFS has no voice and is not decoded at all. After decoding: Whisper's own rule (the
no-speech token's probability at the start token above 0.6 while the text's average
log-probability is below -1) misses most of these, because "you" on silence is a confident
token (average log-probability -0.4 on digital silence, -0.5 on mains hum); a no-speech
probability above 0.8 is therefore enough on its own. Measured with tiny.en: silence, hiss,
brown noise and hum at -60..-20 dBFS gave 0.85-0.95; the devset's recordings gave 0.003-0.23,
and 0.7 s cuts holding one spoken digit 0.07-0.42.

A previous-text prompt (a stream's hotwords, "Glossary: ...") raises the no-speech
probability of speech: with a 20-name glossary the devset's recordings and the hotword tune
sentences gave 0.005-0.82 (digit strings the highest) and hiss, brown noise and hum at
-60..-26 dBFS 0.93-0.97, so a prompted decode is no speech on its own above
``prompted_no_speech_prob`` (0.9).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from oasr.models.whisper.frontend import SAMPLE_RATE


@dataclass(frozen=True)
class NoSpeechRule:
    """Thresholds of the no-speech decision.

    Attributes:
        voice_dbfs: a segment whose loudest ``voice_window_s`` is quieter (RMS, dB full scale)
            has no voice.
        voice_window_s: the window of the loudness check.
        no_speech_prob: Whisper's rule: above this no-speech probability ...
        max_avg_log_prob: ... with the text's average log-probability below this, no speech.
        confident_no_speech_prob: above this no-speech probability, no speech whatever the
            text's log-probability.
        prompted_no_speech_prob: the same for a decode given a previous-text prompt.
    """

    voice_dbfs: float = -45.0
    voice_window_s: float = 0.1
    no_speech_prob: float = 0.6
    max_avg_log_prob: float = -1.0
    confident_no_speech_prob: float = 0.8
    prompted_no_speech_prob: float = 0.9

    def __post_init__(self) -> None:
        if not self.voice_window_s > 0:
            raise ValueError(f"voice_window_s must be > 0, got {self.voice_window_s}")
        for name in ("no_speech_prob", "confident_no_speech_prob", "prompted_no_speech_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"NoSpeechRule.{name} is a probability in 0..1, got {value}")
        if self.confident_no_speech_prob < self.no_speech_prob:
            raise ValueError(
                f"confident_no_speech_prob ({self.confident_no_speech_prob}) must be >= "
                f"no_speech_prob ({self.no_speech_prob})"
            )

    def loudest_dbfs(self, audio: np.ndarray | torch.Tensor) -> float:
        """RMS level (dBFS) of the loudest ``voice_window_s`` window of 16 kHz ``audio`` (N,)
        (the whole segment when it is shorter); -inf for digital silence or no samples."""
        samples = np.asarray(audio, dtype=np.float64).reshape(-1)
        if samples.size == 0:
            return float("-inf")
        width = min(samples.size, max(1, round(self.voice_window_s * SAMPLE_RATE)))
        energy = np.concatenate([[0.0], np.cumsum(np.square(samples))])  # (N + 1,)
        loudest = float(np.max(energy[width:] - energy[:-width])) / width
        return 10.0 * float(np.log10(loudest)) if loudest > 0 else float("-inf")

    def has_voice(self, audio: np.ndarray | torch.Tensor) -> bool:
        """True when some window of the segment is louder than ``voice_dbfs``."""
        return self.loudest_dbfs(audio) > self.voice_dbfs

    def is_no_speech(self, no_speech_prob: float | None, avg_log_prob: float,
                     prompted: bool = False) -> bool:
        """Whisper judged the segment to hold no speech (False when the vocabulary has no
        no-speech token, ``no_speech_prob`` None); ``prompted``: it was decoded after a
        previous-text prompt."""
        if no_speech_prob is None:
            return False
        confident = self.prompted_no_speech_prob if prompted else self.confident_no_speech_prob
        if no_speech_prob > confident:
            return True
        return no_speech_prob > self.no_speech_prob and avg_log_prob < self.max_avg_log_prob
