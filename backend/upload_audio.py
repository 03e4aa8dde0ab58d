"""An uploaded audio file: checked from its header, then decoded a block at a time.

A compressed file can decode to far more than it weighs: a 0.4 MiB FLAC of ten minutes of
192 kHz stereo silence is 0.9 GB of float32. So `UploadAudio.open` reads only the header
(libsndfile's frames, sample rate and channels) and refuses, before decoding anything, a
sample rate outside 8..192 kHz (400) or audio longer than the limit (413); `read_block` then
decodes at most `BLOCK_SAMPLES` samples (all channels together) at a time and mixes them to
mono float32 at the file's own rate, which the engine stream resamples as it does a live
client's. Frames are counted as they are decoded too, so a header that understates its length
gains nothing.

Messages never name a server path: libsndfile reads the upload through its file object.
"""

from __future__ import annotations

import threading
from typing import IO

import numpy as np
import soundfile

from oasr.audio import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE

BLOCK_SAMPLES = 1 << 18  # samples decoded at once, all channels together: 1 MiB of float32
DECODABLE = "wav, flac, ogg, mp3 and what else libsndfile reads"


class UploadRefused(Exception):
    """An upload oasr will not decode: ``status`` 400 (not audio, bad samples) or 413 (over
    the duration limit)."""

    def __init__(self, message: str, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.code = message, status, code


class UploadAudio:
    """One uploaded file, open for decoding (from any thread: a lock keeps `close` from
    freeing the decoder under a `read_block` still running on a worker thread).

    Invariant: at most ``max_duration_s`` seconds of audio are ever decoded.
    """

    def __init__(self, sound: soundfile.SoundFile, name: str, max_duration_s: float) -> None:
        self._sound = sound
        self.name = name
        self.sample_rate: int = sound.samplerate
        self.channels: int = sound.channels
        self.max_duration_s = max_duration_s
        self.frames = sound.frames  # as the header says
        self.frames_read = 0
        self._lock = threading.Lock()

    @classmethod
    def open(cls, file: IO[bytes], name: str, max_duration_s: float) -> UploadAudio:
        """Open ``file`` (seekable) and check its header against the limits.

        Raises:
            UploadRefused: not audio libsndfile reads, a sample rate out of range, or longer
                than ``max_duration_s`` (413), each naming the file and the limit.
        """
        try:
            sound = soundfile.SoundFile(file)
        except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
            reason = getattr(exc, "error_string", None) or type(exc).__name__
            raise UploadRefused(f"the file {name!r} is not audio oasr can decode ({DECODABLE}):"
                                f" {reason}") from None
        audio = cls(sound, name, max_duration_s)
        try:
            audio._check_header()
        except UploadRefused:
            sound.close()
            raise
        return audio

    @property
    def duration_s(self) -> float:
        """The file's length in seconds: its header's, or what was decoded if that is more."""
        return max(self.frames, self.frames_read) / self.sample_rate

    def _check_header(self) -> None:
        if not MIN_SAMPLE_RATE <= self.sample_rate <= MAX_SAMPLE_RATE:
            raise UploadRefused(
                f"the file {self.name!r} is sampled at {self.sample_rate} Hz; oasr takes "
                f"{MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
        if self.channels < 1:
            raise UploadRefused(f"the file {self.name!r} has no audio channels")
        self._check_duration(self.frames)

    def _check_duration(self, frames: int) -> None:
        seconds = frames / self.sample_rate
        if seconds > self.max_duration_s:
            raise UploadRefused(
                f"the file {self.name!r} holds {seconds:.1f} s of audio; the limit is "
                f"{self.max_duration_s:g} s of decoded audio per upload", status=413,
                code="audio_too_long")

    def read_block(self) -> np.ndarray:
        """The next block as (N,) mono float32 at ``sample_rate``; empty at the end.

        Raises:
            UploadRefused: NaN or infinite samples, audio past the limit, or a decoding error.
        """
        frames = max(1, BLOCK_SAMPLES // self.channels)
        with self._lock:
            if self._sound.closed:
                return np.zeros(0, dtype=np.float32)
            try:
                data = self._sound.read(frames, dtype="float32", always_2d=True)  # (N, C)
            except (soundfile.LibsndfileError, RuntimeError) as exc:
                reason = getattr(exc, "error_string", None) or type(exc).__name__
                raise UploadRefused(
                    f"the file {self.name!r} could not be decoded: {reason}") from None
        self.frames_read += data.shape[0]
        self._check_duration(self.frames_read)
        mono = data[:, 0] if self.channels == 1 else data.mean(axis=1, dtype=np.float32)
        mono = np.ascontiguousarray(mono, dtype=np.float32)
        if not np.isfinite(mono).all():
            raise UploadRefused(f"the file {self.name!r} holds NaN or infinite samples")
        return mono

    def close(self) -> None:
        """Free the decoder, once a read in progress on another thread has returned."""
        with self._lock:
            self._sound.close()
