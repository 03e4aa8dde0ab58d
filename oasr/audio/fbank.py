"""Log-mel filterbank features, streamed per stream and offline.

The settings are those a WeNet U2/U2++ model was trained with: Kaldi fbank of the 16 kHz
waveform taken in int16 units (float samples in [-1, 1] times 32768), 80 mel bins, 25 ms
Povey windows every 10 ms, no dither, energy floor 0, pre-emphasis 0.97, DC offset removed,
FFT size rounded up to a power of two, mel range 20 Hz..Nyquist, ``snip_edges`` (only whole
windows: a stream of N >= 400 samples has 1 + (N - 400) // 160 frames), no energy
coefficient. CMVN is not applied here: it belongs to the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import kaldi_native_fbank as knf
import numpy as np

from oasr.audio.chunking import check_accept_waveform, check_drop_index, check_frame_range
from oasr.audio.resample import MODEL_SAMPLE_RATE


@dataclass(frozen=True)
class FbankConfig:
    """Kaldi fbank settings; the defaults reproduce WeNet's training features.

    ``input_scale`` multiplies the float32 samples before the transform (32768 maps [-1, 1]
    onto the int16 range the models were trained on).
    """

    sample_rate: int = MODEL_SAMPLE_RATE
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 0.0
    energy_floor: float = 0.0
    window_type: str = "povey"
    preemph_coeff: float = 0.97
    remove_dc_offset: bool = True
    round_to_power_of_two: bool = True
    snip_edges: bool = True
    use_energy: bool = False
    low_freq: float = 20.0
    high_freq: float = 0.0
    input_scale: float = 32768.0

    def __post_init__(self) -> None:
        if self.sample_rate <= 0:
            raise ValueError(f"sample_rate must be > 0 Hz, got {self.sample_rate}")
        if self.num_mel_bins < 1:
            raise ValueError(f"num_mel_bins must be >= 1, got {self.num_mel_bins}")
        if not 0 < self.frame_shift_ms <= self.frame_length_ms:
            raise ValueError(
                f"need 0 < frame_shift_ms <= frame_length_ms, got shift {self.frame_shift_ms} "
                f"and length {self.frame_length_ms}"
            )
        if self.dither < 0 or self.energy_floor < 0:
            raise ValueError(
                f"dither and energy_floor must be >= 0, got {self.dither} and {self.energy_floor}"
            )
        if self.window_type not in ("povey", "hamming", "hanning", "rectangular", "blackman"):
            raise ValueError(
                f"unknown window_type {self.window_type!r}; use povey (WeNet's), hamming, "
                f"hanning, rectangular or blackman"
            )
        if self.input_scale <= 0:
            raise ValueError(f"input_scale must be > 0, got {self.input_scale}")

    @property
    def window_samples(self) -> int:
        """Samples in one analysis window (400 at 16 kHz, 25 ms)."""
        return round(self.sample_rate * self.frame_length_ms / 1000)

    @property
    def shift_samples(self) -> int:
        """Samples between consecutive frames (160 at 16 kHz, 10 ms)."""
        return round(self.sample_rate * self.frame_shift_ms / 1000)

    def num_frames(self, num_samples: int) -> int:
        """Frames an input of ``num_samples`` yields once finished (``snip_edges`` only)."""
        assert self.snip_edges, "frame count formula assumes snip_edges"
        if num_samples < self.window_samples:
            return 0
        return 1 + (num_samples - self.window_samples) // self.shift_samples

    def to_knf_options(self) -> knf.FbankOptions:
        """These settings as kaldi-native-fbank options."""
        opts = knf.FbankOptions()
        frame = opts.frame_opts
        frame.samp_freq = float(self.sample_rate)
        frame.frame_length_ms = self.frame_length_ms
        frame.frame_shift_ms = self.frame_shift_ms
        frame.dither = self.dither
        frame.window_type = self.window_type
        frame.preemph_coeff = self.preemph_coeff
        frame.remove_dc_offset = self.remove_dc_offset
        frame.round_to_power_of_two = self.round_to_power_of_two
        frame.snip_edges = self.snip_edges
        opts.mel_opts.num_bins = self.num_mel_bins
        opts.mel_opts.low_freq = self.low_freq
        opts.mel_opts.high_freq = self.high_freq
        opts.energy_floor = self.energy_floor
        opts.use_energy = self.use_energy
        return opts


class StreamingFbank:
    """One stream's fbank extractor with a bounded, absolutely indexed frame store.

    Frames are numbered from 0 at the start of the stream. `num_frames_ready` counts every frame
    computed so far; frames ``[num_frames_dropped, num_frames_ready)`` are retained and can be
    read any number of times with `get_frames` (so overlapping encoder windows reuse frames
    instead of recomputing them). The consumer drops what it no longer needs with
    `drop_frames_before`, which keeps memory bounded for streams of any length. The store is
    kaldi-native-fbank's own recycling frame vector: reading copies, dropping is O(dropped).
    """

    def __init__(self, config: FbankConfig | None = None) -> None:
        self.config = config or FbankConfig()
        self._fbank = knf.OnlineFbank(self.config.to_knf_options())
        self._scale = np.float32(self.config.input_scale)
        self.num_frames_dropped = 0
        self.num_samples_accepted = 0
        self.is_finished = False

    @property
    def dim(self) -> int:
        """Feature dimension (number of mel bins)."""
        return self.config.num_mel_bins

    @property
    def num_frames_ready(self) -> int:
        """Frames computed since the start of the stream, dropped ones included."""
        return int(self._fbank.num_frames_ready)

    @property
    def num_frames_retained(self) -> int:
        """Frames that can still be read: ``num_frames_ready - num_frames_dropped``."""
        return self.num_frames_ready - self.num_frames_dropped

    def accept_waveform(self, samples: np.ndarray) -> None:
        """Append samples to the stream; complete frames become ready immediately.

        Args:
            samples: (N,) float32 mono samples in [-1, 1] at ``config.sample_rate``; N may be 0.

        Raises:
            ValueError: ``samples`` is not a 1-D float32 array.
            RuntimeError: called after `input_finished`.
        """
        check_accept_waveform(self, samples)
        if samples.shape[0] == 0:
            return
        self._fbank.accept_waveform(self.config.sample_rate, samples * self._scale)
        self.num_samples_accepted += samples.shape[0]

    def input_finished(self) -> None:
        """Mark the end of the stream. With ``snip_edges`` no further frame appears.

        Raises:
            RuntimeError: called twice.
        """
        if self.is_finished:
            raise RuntimeError("input_finished called twice")
        self._fbank.input_finished()
        self.is_finished = True

    def get_frames(self, start: int, end: int) -> np.ndarray:
        """Copy retained frames ``[start, end)`` (absolute indices).

        Returns:
            (end - start, num_mel_bins) float32, owned by the caller.

        Raises:
            IndexError: the range is empty-reversed, already dropped or not ready yet.
        """
        check_frame_range(self, start, end)
        out = np.empty((end - start, self.dim), dtype=np.float32)  # (T, F)
        for row, index in enumerate(range(start, end)):
            out[row] = self._fbank.get_frame(index)
        return out

    def drop_frames_before(self, index: int) -> None:
        """Forget every frame before absolute ``index``; a no-op for already dropped ones.

        Raises:
            IndexError: ``index`` is beyond `num_frames_ready`.
        """
        if check_drop_index(self, index):
            self._fbank.pop(index - self.num_frames_dropped)
            self.num_frames_dropped = index

    def pop_frames(self, num_frames: int) -> np.ndarray:
        """Take the oldest ``num_frames`` retained frames out of the store.

        Returns:
            (num_frames, num_mel_bins) float32.

        Raises:
            IndexError: fewer than ``num_frames`` are retained.
        """
        start = self.num_frames_dropped
        frames = self.get_frames(start, start + num_frames)
        self.drop_frames_before(start + num_frames)
        return frames


def compute_fbank(samples: np.ndarray, config: FbankConfig | None = None) -> np.ndarray:
    """Offline fbank of a whole utterance, identical to streaming it through `StreamingFbank`.

    Args:
        samples: (N,) float32 mono samples in [-1, 1] at ``config.sample_rate``.

    Returns:
        (T, num_mel_bins) float32 with T = ``config.num_frames(N)``.
    """
    fbank = StreamingFbank(config)
    fbank.accept_waveform(samples)
    fbank.input_finished()
    return fbank.get_frames(0, fbank.num_frames_ready)
