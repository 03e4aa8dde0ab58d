"""An icefall Zipformer's features: kaldi-native-fbank as icefall computes them, and the
LOG_EPS tail icefall's streaming decode appends at the end of a stream.

icefall (lhotse / kaldifeat, and sherpa-onnx for served models): 80 mel bins of the float
waveform in [-1, 1] (no int16 scaling), 25 ms Povey windows every 10 ms, no dither, no
``snip_edges`` (frames centred, the first at sample 0), high frequency Nyquist - 400 Hz, no
CMVN: the model's front end takes raw log-mel.
"""

from __future__ import annotations

import numpy as np

from oasr.audio.chunking import FeatureSource, check_drop_index, check_frame_range
from oasr.audio.fbank import FbankConfig, StreamingFbank
from oasr.models.zipformer.model import LOG_EPS

ICEFALL_FBANK = FbankConfig(num_mel_bins=80, dither=0.0, snip_edges=False, high_freq=-400.0,
                            input_scale=1.0)
# Frames appended at the end: the 16 frames of right context past an encoder frame's own 4,
# so the encoder frame holding the last real fbank frame is decoded, and no more. (icefall's
# decode loop appends 13 + 30 and decodes the ~7 extra frames of padding too: harmless
# offline, but in a live engine it would add 0.3 s of silence to every stream's timeline.)
TAIL_FRAMES = 16


class TailPaddedFeatures:
    """A feature source whose finished input is followed by ``num_tail`` LOG_EPS frames, so
    the last real frames get a full window of right context, as in icefall's decode loop.

    Invariant: frames below ``source.num_frames_ready`` are the source's; once the input has
    finished, frames ``[real, real + num_tail)`` read as LOG_EPS.
    """

    def __init__(self, source: FeatureSource, dim: int, num_tail: int = TAIL_FRAMES) -> None:
        self.source = source
        self.dim = dim
        self.num_tail = num_tail
        self._dropped = 0

    @property
    def is_finished(self) -> bool:
        return self.source.is_finished

    @property
    def num_frames_ready(self) -> int:
        return self.source.num_frames_ready + (self.num_tail if self.source.is_finished else 0)

    @property
    def num_frames_dropped(self) -> int:
        return self._dropped

    @property
    def num_frames_retained(self) -> int:
        return self.num_frames_ready - self._dropped

    @property
    def num_samples_accepted(self) -> int:
        return self.source.num_samples_accepted

    def accept_waveform(self, samples: np.ndarray) -> None:
        self.source.accept_waveform(samples)

    def input_finished(self) -> None:
        self.source.input_finished()

    def get_frames(self, start: int, end: int) -> np.ndarray:
        """(end - start, dim) float32: the source's frames, then LOG_EPS past its end.

        Raises:
            IndexError: frames not retained or not ready.
        """
        check_frame_range(self, start, end)
        real = self.source.num_frames_ready
        out = np.full((end - start, self.dim), LOG_EPS, dtype=np.float32)
        if start < real:
            out[: min(end, real) - start] = self.source.get_frames(start, min(end, real))
        return out

    def drop_frames_before(self, index: int) -> None:
        if check_drop_index(self, index):
            self.source.drop_frames_before(min(index, self.source.num_frames_ready))
            self._dropped = index


def icefall_features() -> TailPaddedFeatures:
    """A fresh stream's features as an icefall Zipformer expects them."""
    return TailPaddedFeatures(StreamingFbank(ICEFALL_FBANK), ICEFALL_FBANK.num_mel_bins)
