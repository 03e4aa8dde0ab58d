"""One stream's whole audio path: client PCM -> 16 kHz -> fbank -> encoder input windows."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from oasr.audio.chunking import ChunkGeometry, ChunkWindower, FeatureWindow
from oasr.audio.fbank import FbankConfig, StreamingFbank
from oasr.audio.pcm import PCM_FORMATS, decode_pcm, validate_sample_rate
from oasr.audio.resample import RESAMPLE_QUALITIES, StreamingResampler


@dataclass(frozen=True)
class FrontendConfig:
    """Everything that fixes how one stream's audio becomes encoder windows.

    Attributes:
        sample_rate: the client's sample rate in Hz (8000..192000).
        fmt: the client's PCM format, ``"s16le"`` or ``"f32le"``.
        geometry: chunk size and conv-stem geometry of the model.
        fbank: fbank settings (their ``sample_rate`` is the model's rate, 16 kHz).
        resample_quality: soxr recipe for client rates other than the model's.
    """

    sample_rate: int = 16000
    fmt: str = "s16le"
    geometry: ChunkGeometry = field(default_factory=ChunkGeometry)
    fbank: FbankConfig = field(default_factory=FbankConfig)
    resample_quality: str = "HQ"

    def __post_init__(self) -> None:
        # Normalise a JSON float such as 48000.0 to the int every consumer expects.
        object.__setattr__(self, "sample_rate", validate_sample_rate(self.sample_rate))
        if self.fmt not in PCM_FORMATS:
            raise ValueError(
                f"unknown PCM format {self.fmt!r}; expected one of {', '.join(PCM_FORMATS)}"
            )
        if self.resample_quality not in RESAMPLE_QUALITIES:
            raise ValueError(
                f"unknown resample quality {self.resample_quality!r}; expected one of "
                f"{', '.join(RESAMPLE_QUALITIES)}"
            )


class AudioFrontend:
    """A stream's audio state between the socket and the encoder.

    Invariant: memory is bounded whatever the stream's length: decoded PCM is resampled and
    turned into fbank frames at once; the fbank store keeps only frames not yet windowed plus
    the window overlap; soxr and the fbank keep a bounded tail of samples.
    Lifecycle: accepting audio until `input_finished`, then only windows can be taken.
    """

    def __init__(self, config: FrontendConfig | None = None) -> None:
        self.config = config or FrontendConfig()
        self.resampler = StreamingResampler(
            self.config.sample_rate, self.config.fbank.sample_rate, self.config.resample_quality
        )
        self.fbank = StreamingFbank(self.config.fbank)
        self.windower = ChunkWindower(self.config.geometry)

    @property
    def is_finished(self) -> bool:
        """True once `input_finished` was called."""
        return self.fbank.is_finished

    @property
    def num_input_samples(self) -> int:
        """Client samples received so far (at the client's rate)."""
        return self.resampler.num_input_samples

    @property
    def num_model_samples(self) -> int:
        """Samples at the model's rate handed to the fbank so far."""
        return self.fbank.num_samples_accepted

    def accept_pcm(self, data: bytes | bytearray | memoryview) -> int:
        """Decode one client PCM frame and feed it through.

        Returns:
            the number of client samples in the frame.

        Raises:
            ValueError: malformed PCM (see `decode_pcm`); the stream's state is unchanged.
            RuntimeError: called after `input_finished`.
        """
        self._check_accepting()
        samples = decode_pcm(data, self.config.fmt)  # (N,) float32
        self.accept_samples(samples)
        return int(samples.shape[0])

    def accept_samples(self, samples: np.ndarray) -> None:
        """Feed (N,) float32 samples in [-1, 1] at the client's rate.

        Raises:
            ValueError: ``samples`` is not a 1-D float32 array.
            RuntimeError: called after `input_finished`.
        """
        self._check_accepting()
        self.fbank.accept_waveform(self.resampler.process(samples))

    def input_finished(self) -> None:
        """End of the client's audio: flush the resampler and finish the fbank.

        Raises:
            RuntimeError: called twice.
        """
        self._check_accepting()
        self.fbank.accept_waveform(self.resampler.flush())
        self.fbank.input_finished()

    def is_window_ready(self) -> bool:
        """True when `pop_window` would return a window now."""
        return self.windower.is_window_ready(self.fbank)

    def is_exhausted(self) -> bool:
        """True when the input has finished and every window has been taken."""
        return self.windower.is_exhausted(self.fbank)

    def pop_window(self) -> FeatureWindow | None:
        """The next encoder input window, or None if not enough audio has arrived yet."""
        return self.windower.pop_window(self.fbank)

    def _check_accepting(self) -> None:
        if self.is_finished:
            raise RuntimeError(
                f"stream audio already finished after {self.num_input_samples} samples"
            )
