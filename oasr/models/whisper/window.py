"""How much audio the Whisper encoder sees for one segment.

Whisper was trained on 30 s windows. Its encoder is a stride-2 conv stem and full-attention
blocks over 1500 frames, so it runs on any shorter (even) number of mel frames with the
positional table cut to match; but a decoder that cross-attends to a cut window loses the
silence it always saw after the speech, and then loops (repeated digits, repeated syllables).
What restores it is the silence: the encoder runs on the segment's frames plus a margin
(rounded up to a bucket so that few shapes occur), and the encoder states of the rest of the
window are those of a silent 30 s window, computed once per model. Cross-attention still spans
the whole window (a silent tail cut to 5 or 10 s brought the loops back); a batch of segments
reads the silent tail's K/V once for all of them (`SegmentEncoder.split_cross_kv`).

Measured with tiny.en, greedy, on the devset (16 real recordings of 3-11 s, 153 words; 12
synthesised sentences, 106 words), WER after ``oasr.text.wer.normalize_transcript``:

    window                                 real          synthesised   tokens (all 28 files)
    30 s (``full``)                        1.96%         7.55%         330
    segment + 2 s, 2 s buckets             1.96%         1.89%         317
    segment + 1 s, 1 or 2 s buckets        3.27%         1.89%         307
    cut to segment + 0..10 s, no tail      145-1330%     (repetition loops: 635-3013 tokens
                                                         on the real files, 211 with 30 s)

Through the engine (bundled CTC model, each real recording one stream) the Whisper finals
scored 1.96% with either window.

The bucket only rounds the margin up (so that few input shapes occur): the silence past the
margin adds nothing the silent tail does not give, and costs encoder time. The default is the
segment plus 2 s in 0.5 s buckets. Over 2,500 words of the dev set, the stress set and the read
passages as a server decodes them (`bench/final_window.py`, 2026-12-07): 187 word errors with
0.5 s buckets against 198 with 2 s (beam finals), 217 against 219 greedy; the dev set's 28
recordings decoded together greedy 2.21 against 2.54 s (one thread, AMD EPYC with AVX512-BF16).
The margin stays 2 s: over three more stress sets (2,727 words) a 1.5 or 1 s margin made 4 more
word errors on the synthetic digit strings (beam 7 against 3, greedy 17 against 13 of 286
words), the other subsets within 4 words either way.

A 5 s segment of ``real_jfk.wav`` on the shared 2-core CPU (one thread, the two windows
interleaved, median of 12 each; two runs under different load): encoder 0.50-0.72 s -> 0.10-0.15
s (3000 -> 800 mel frames, 2 s buckets), whole second pass 0.74-1.09 s -> 0.31-0.52 s. The
decoder (0.21-0.35 s for 8 tokens, a third of it the 51864-row output projection) is then most
of it; the silent frames' cross K/V are projected once per model.
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
# `SegmentEncoder.split_cross_kv` splits a batch's cross K/V when its rows' own frames are at
# most this many (20 s of 30): a layer of 8 segments attended in 1.5 against 4.0 ms with 300
# own frames, 2.3 against 3.4-3.6 with 600, about even with 1,000 (3.2 against 3.4-3.8), and
# slower with 1,200 (one thread, Sapphire Rapids Xeon, bfloat16)
SPLIT_MAX_OWN = 1000
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
            sees at most 30 / ``bucket_s`` input shapes (segments of one shape are encoded
            together).
    """

    mode: str = "fit"
    margin_s: float = 2.0
    bucket_s: float = 0.5

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


@dataclass(frozen=True)
class EncodedSegments:
    """Encoder states of a batch of whole windows.

    Attributes:
        states: (B, n_audio_ctx, d).
        num_encoded: per row, the leading frames the encoder computed from the row's audio;
            the frames after them are the silent window's (``n_audio_ctx``: none are).
    """

    states: torch.Tensor
    num_encoded: tuple[int, ...]


CrossKv = list[tuple[torch.Tensor, torch.Tensor]]  # per decoder layer K, V: (B, S, H, D)


class SegmentEncoder:
    """Waveforms -> encoder states of whole windows, the encoder run as ``window`` says, and
    their cross-attention K/V.

    Holds the model, the frontend and (``fit`` mode, computed at first use) the encoder
    states of a silent window and their cross K/V; no per-request state.
    """

    def __init__(self, model: WhisperModel, window: EncoderWindow | None = None) -> None:
        self.model = model
        self.window = window or EncoderWindow()
        self.frontend = WhisperFrontend(model.config.n_mels, model.device)
        self._silence: torch.Tensor | None = None  # (n_audio_ctx, d)
        self._silence_kv: CrossKv | None = None  # per layer (1, n_audio_ctx, H, D)

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

    def silence_cross_kv(self) -> CrossKv:
        """Per decoder layer the cross K, V (1, n_audio_ctx, H, D) of ``silence_states``."""
        if self._silence_kv is None:
            with torch.inference_mode():
                self._silence_kv = self.model.decoder.cross_kv(self.silence_states()[None])
        return self._silence_kv

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
    def encode_features(self, groups: Sequence[MelGroup]) -> EncodedSegments:
        """Encoder states of ``features``' groups, rows in batch order."""
        ctx = self.model.config.n_audio_ctx
        num_encoded = [0] * sum(len(g.rows) for g in groups)
        out: torch.Tensor | None = None
        for group in groups:
            states = self.model.encoder(group.mel)  # (b, T / 2, d)
            frames = states.size(1)
            if out is None:
                out = states.new_empty(len(num_encoded), ctx, states.size(-1))
            index = torch.tensor(group.rows, device=states.device)
            out[index, :frames] = states
            if frames < ctx:
                out[index, frames:] = self.silence_states()[frames:]
            for row in group.rows:
                num_encoded[row] = frames
        if out is None:
            raise ValueError("SegmentEncoder needs at least one waveform, got 0")
        return EncodedSegments(out, tuple(num_encoded))

    def encode(self, waveforms: Sequence[torch.Tensor | np.ndarray]) -> EncodedSegments:
        """Encoder states of B mono 16 kHz waveforms, each <= 30 s."""
        if len(waveforms) == 0:
            raise ValueError("SegmentEncoder needs at least one waveform, got 0")
        return self.encode_features(self.features(waveforms))

    def __call__(self, waveforms: Sequence[torch.Tensor | np.ndarray]) -> torch.Tensor:
        """Encoder states (B, n_audio_ctx, d) of B mono 16 kHz waveforms, each <= 30 s."""
        return self.encode(waveforms).states

    @torch.inference_mode()
    def cross_kv(self, encoded: EncodedSegments) -> CrossKv:
        """Per decoder layer the cross K, V (B, n_audio_ctx, H, D) of ``encoded``: projected
        for each row's encoded frames, the silent window's for the rest (a projection is per
        frame, so this equals projecting the whole window). Where rows end in silence the
        tensors are views of head-major (B, H, n_audio_ctx, D) storage, which `DecoderKv`
        keeps without a copy."""
        return self._window_kv(encoded, encoded.states.size(1))

    @torch.inference_mode()
    def split_cross_kv(self, encoded: EncodedSegments) -> tuple[CrossKv, CrossKv | None]:
        """``cross_kv`` in two parts where that is cheaper to attend: each row's first L frames
        (L = the most frames encoded for any row; a row encoded shorter has the silent
        window's frames up to L), and the silent window's frames from L, one copy for all rows.

        Pays where a batch reads much silence: 2 or more rows and L <= `SPLIT_MAX_OWN` frames
        (`DecoderKv`'s ``shared_tail`` reads the rows' L frames each and the tail once).

        Returns:
            (own, tail): own per layer (K, V) each (B, L, H, D), views of head-major storage;
            tail per layer (K, V) each (1, n_audio_ctx - L, H, D). (``cross_kv``, None)
            where splitting does not pay.
        """
        ctx, batch = encoded.states.size(1), encoded.states.size(0)
        own = max(encoded.num_encoded)
        if batch < 2 or own > SPLIT_MAX_OWN or own >= ctx:
            return self.cross_kv(encoded), None
        tail = [(k[:, own:], v[:, own:]) for k, v in self.silence_cross_kv()]
        return self._window_kv(encoded, own), tail

    @torch.inference_mode()
    def own_cross_kv(self, encoded: EncodedSegments) -> CrossKv:
        """``cross_kv`` of each row's window up to the most frames encoded for any row (L),
        per layer (K, V) each (B, L, H, D): what a paged decoder row stores when the silent
        window's frames continue it (`silence_tail_kv`); a row encoded shorter than L has the
        silent window's frames up to L."""
        return self._window_kv(encoded, max(encoded.num_encoded))

    def silence_tail_kv(self) -> CrossKv:
        """Per decoder layer the silent window's cross K, V, each head-major
        (H, n_audio_ctx, D): the frames after every row's own
        (`DecoderKVCacheManager.set_shared_tail`)."""
        return [(k[0].transpose(0, 1), v[0].transpose(0, 1)) for k, v in self.silence_cross_kv()]

    def _window_kv(self, encoded: EncodedSegments, frames: int) -> CrossKv:
        """Per layer K, V (B, frames, H, D) of the first ``frames`` frames of each row's window
        (its encoded frames, then the silent window's); head-major storage unless every row was
        encoded whole. ``frames`` is at least every row's encoded frames."""
        states, ctx = encoded.states, encoded.states.size(1)
        decoder = self.model.decoder
        if all(n == ctx for n in encoded.num_encoded):
            return decoder.cross_kv(states[:, :frames])
        batch = states.size(0)
        out = [(_head_major_rows(k[:, :frames], batch), _head_major_rows(v[:, :frames], batch))
               for k, v in self.silence_cross_kv()]
        for encoded_frames in sorted(set(encoded.num_encoded)):  # each <= frames
            rows = [i for i, n in enumerate(encoded.num_encoded) if n == encoded_frames]
            index = torch.tensor(rows, device=states.device)
            for (k_out, v_out), (k, v) in zip(
                    out, decoder.cross_kv(states[index, :encoded_frames]), strict=True):
                # row by row: a plain strided copy each, where an indexed write into the
                # head-major storage took 13x as long (2.5 ms a layer's K for 8 rows)
                for j, row in enumerate(rows):  # k, v: (b, encoded_frames, H, D)
                    k_out[row, :encoded_frames].copy_(k[j])
                    v_out[row, :encoded_frames].copy_(v[j])
        return out


def _head_major_rows(x: torch.Tensor, batch: int) -> torch.Tensor:
    """``batch`` copies of ``x`` (1, S, H, D), stored head-major (B, H, S, D) and returned as
    the (B, S, H, D) view."""
    rows = x[0].transpose(0, 1).expand(batch, -1, -1, -1)  # (B, H, S, D)
    return rows.clone(memory_format=torch.contiguous_format).transpose(1, 2)
