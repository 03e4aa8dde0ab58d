"""How much audio the Whisper encoder sees for one segment.

Whisper was trained on 30 s windows. Its encoder is a stride-2 conv stem and full-attention
blocks over 1500 frames, so it runs on any shorter (even) number of mel frames with the
positional table cut to match; but a decoder that cross-attends to a cut window loses the
silence it always saw after the speech, and then loops (repeated digits, repeated syllables).
What restores it is the silence: the encoder runs on the segment's frames plus a margin
(rounded up to a bucket so that few shapes occur), and the encoder states of the rest of the
window are those of a silent 30 s window, computed once per model. Cross-attention still spans
the whole window (a silent tail cut to 5 or 10 s brought the loops back), so only the
encoder's cost shrinks with the segment.

Measured with tiny.en, greedy, on the devset (16 real recordings of 3-11 s, 153 words; 12
synthesised sentences, 106 words), WER after ``oasr.metrics.normalize_transcript``:

    window                                 real          synthesised   tokens (all 28 files)
    30 s (``full``)                        1.96%         7.55%         330
    segment + 2 s, 2 s buckets (default)   1.96%         1.89%         317
    segment + 1 s, 1 or 2 s buckets        3.27%         1.89%         307
    cut to segment + 0..10 s, no tail      145-1330%     (repetition loops: 635-3013 tokens
                                                         on the real files, 211 with 30 s)

Through the engine (bundled CTC model, each real recording one stream) the Whisper finals
scored 1.96% with either window. A 5 s segment of ``real_jfk.wav`` on the shared 2-core CPU
(one thread, median of 12): encoder 0.72 s -> 0.15 s (3000 -> 800 mel frames), whole second
pass 1.09 s -> 0.52 s; the decoder (0.35 s for 8 tokens) is then most of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.models.whisper.frontend import HOP_LENGTH, SAMPLE_RATE, WhisperFrontend
from oasr.models.whisper.model import WhisperModel

WINDOW_MODES = ("full", "fit")
_FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 mel frames per second


@dataclass(frozen=True)
class EncoderWindow:
    """The encoder's input length for a segment.

    Attributes:
        mode: ``"full"`` runs the encoder on the whole 30 s window; ``"fit"`` runs it on the
            segment plus ``margin_s`` of silence, rounded up to a multiple of ``bucket_s``, and
            completes the window with a silent window's encoder states.
        margin_s: silence after the segment's last sample that the encoder sees (``fit``).
        bucket_s: the encoder input is a multiple of this many seconds (``fit``), so a server
            sees at most 30 / ``bucket_s`` input shapes.
    """

    mode: str = "fit"
    margin_s: float = 2.0
    bucket_s: float = 2.0

    def __post_init__(self) -> None:
        if self.mode not in WINDOW_MODES:
            raise ValueError(f"EncoderWindow.mode must be one of {WINDOW_MODES}, got {self.mode!r}")
        if not self.margin_s >= 0.0:
            raise ValueError(f"EncoderWindow.margin_s must be >= 0 seconds, got {self.margin_s}")
        if not self.bucket_s > 0.0:
            raise ValueError(f"EncoderWindow.bucket_s must be > 0 seconds, got {self.bucket_s}")

    @property
    def bucket_frames(self) -> int:
        """Mel frames per bucket, rounded up to even (the conv stem halves the frames)."""
        return 2 * math.ceil(self.bucket_s * _FRAMES_PER_SECOND / 2)

    def num_frames(self, num_samples: int, full_frames: int) -> int:
        """Mel frames the encoder takes for a segment of ``num_samples`` 16 kHz samples.

        Args:
            num_samples: the segment's length.
            full_frames: mel frames of the model's whole window (3000 for 30 s).
        Returns:
            An even count in 2..``full_frames`` (``full_frames`` in ``full`` mode).
        """
        if self.mode == "full":
            return full_frames
        wanted = (num_samples / SAMPLE_RATE + self.margin_s) * _FRAMES_PER_SECOND
        buckets = max(1, math.ceil(wanted / self.bucket_frames))
        return min(full_frames, buckets * self.bucket_frames)


@dataclass(frozen=True)
class MelGroup:
    """Rows of a batch that share one encoder input length.

    Attributes:
        rows: indices into the batch.
        mel: (len(rows), n_mels, T) log-mel, T even.
    """

    rows: tuple[int, ...]
    mel: torch.Tensor


class SegmentEncoder:
    """Waveforms -> encoder states of whole windows, the encoder run as ``window`` says.

    Holds the model, the frontend and (``fit`` mode, computed at first use) the encoder
    states of a silent window; no per-request state.
    """

    def __init__(self, model: WhisperModel, window: EncoderWindow | None = None) -> None:
        self.model = model
        self.window = window or EncoderWindow()
        self.frontend = WhisperFrontend(model.config.n_mels, model.device)
        self._silence: torch.Tensor | None = None  # (n_audio_ctx, d)

    @property
    def full_frames(self) -> int:
        return self.model.config.n_input_frames

    def silence_states(self) -> torch.Tensor:
        """(n_audio_ctx, d) encoder states of a window of digital silence."""
        if self._silence is None:
            with torch.inference_mode():
                mel = self.frontend([np.zeros(1, dtype=np.float32)], self.full_frames)
                self._silence = self.model.encoder(mel)[0]
        return self._silence

    def features(self, waveforms: Sequence[torch.Tensor | np.ndarray]) -> list[MelGroup]:
        """Log-mel of each waveform, grouped by encoder input length (one group in ``full``
        mode)."""
        by_frames: dict[int, list[int]] = {}
        for row, wave in enumerate(waveforms):
            frames = self.window.num_frames(int(wave.shape[-1]), self.full_frames)
            by_frames.setdefault(frames, []).append(row)
        return [MelGroup(tuple(rows), self.frontend([waveforms[r] for r in rows], frames))
                for frames, rows in sorted(by_frames.items())]

    @torch.inference_mode()
    def encode_features(self, groups: Sequence[MelGroup]) -> torch.Tensor:
        """Encoder states (B, n_audio_ctx, d) of ``features``' groups, rows in batch order."""
        ctx = self.model.config.n_audio_ctx
        batch = sum(len(g.rows) for g in groups)
        out: torch.Tensor | None = None
        for group in groups:
            states = self.model.encoder(group.mel)  # (b, T / 2, d)
            if out is None:
                out = states.new_empty(batch, ctx, states.size(-1))
            index = torch.tensor(group.rows, device=states.device)
            out[index, : states.size(1)] = states
            if states.size(1) < ctx:
                out[index, states.size(1) :] = self.silence_states()[states.size(1) :]
        if out is None:
            raise ValueError("SegmentEncoder needs at least one waveform, got 0")
        return out

    def __call__(self, waveforms: Sequence[torch.Tensor | np.ndarray]) -> torch.Tensor:
        """Encoder states (B, n_audio_ctx, d) of B mono 16 kHz waveforms, each <= 30 s."""
        if len(waveforms) == 0:
            raise ValueError("SegmentEncoder needs at least one waveform, got 0")
        return self.encode_features(self.features(waveforms))
