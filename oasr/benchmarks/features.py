"""The two frontends' cost per stream-chunk: kaldi fbank (Conformer-CTC) against the causal
log-mel (Whisper-CTC), on the same speech, fed the way the engine feeds them.

Each stream gets one extractor of each kind (`StreamingFbank`; `BufferedFeatures` around
`CausalLogMel`, exactly what `WhisperCtcFamily.new_features` builds) and receives its audio in
640 ms pieces. The fbank is fed stream by stream (the engine's step does the same). The
log-mel is timed both ways: a stream alone, and every stream's piece in one `accept_waveforms`
call (the engine's step: one FFT and one mel product for all streams), that call's time shared
by its streams. The kinds alternate piece by piece so load bursts hit all alike.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oasr.audio import BufferedFeatures, StreamingFbank, accept_waveforms
from oasr.benchmarks.workload import load_speech
from oasr.models.whisper_ctc import CausalLogMel
from oasr.models.whisper_ctc.frontend import LogMelSpectra

CHUNK_SAMPLES = 10240  # 640 ms: one chunk of audio in both families


@contextlib.contextmanager
def blas_threads(num_threads: int | None) -> Iterator[int | None]:
    """numpy's BLAS pool limited to ``num_threads`` inside the block (None: left as it is).

    Yields the limit in force, or None when ``threadpoolctl`` is not installed (no limit set).
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield None
        return
    if num_threads is None:
        yield None
        return
    with threadpool_limits(limits=num_threads, user_api="blas"):
        yield num_threads


@dataclass(frozen=True)
class FrontendCost:
    """Milliseconds per stream-chunk (640 ms of audio) of each frontend, medians.

    Attributes:
        num_streams, num_chunks: the run's size (every stream fed ``num_chunks`` pieces).
        fbank_ms: kaldi-native-fbank (80 bins, 25/10 ms), one stream's piece.
        log_mel_ms: causal log-mel (80 bins, 400-point FFT, hop 160), one stream's piece alone.
        log_mel_batched_ms: the causal log-mel of every stream's piece in one call, divided by
            ``num_streams``.
        fbank_frames, log_mel_frames: frames each produced in all (a check both did the work).
    """

    num_streams: int
    num_chunks: int
    fbank_ms: float
    log_mel_ms: float
    log_mel_batched_ms: float
    fbank_frames: int
    log_mel_frames: int

    @property
    def log_mel_vs_fbank(self) -> float:
        """How many times the fbank's cost the log-mel costs per stream, fed as the engine
        feeds it (all streams at once)."""
        return self.log_mel_batched_ms / self.fbank_ms


def _median_ms(seconds: list[float]) -> float:
    return 1e3 * float(np.median(seconds))


def measure_frontends(audio_dir: Path, num_streams: int = 16,
                      num_chunks: int = 6) -> FrontendCost:
    """Feed ``num_streams`` streams ``num_chunks`` pieces of 640 ms to every frontend."""
    speech = load_speech(audio_dir, num_streams, num_chunks * CHUNK_SAMPLES / 16000)
    fbanks = [StreamingFbank() for _ in speech]
    alone = [BufferedFeatures(CausalLogMel(80), 80) for _ in speech]
    shared = LogMelSpectra(80)  # as an engine's streams share it: one call for all
    batched = [BufferedFeatures(CausalLogMel(80, shared), 80) for _ in speech]
    times: dict[str, list[float]] = {"fbank": [], "alone": [], "batched": []}
    for k in range(num_chunks):
        pieces = [audio[k * CHUNK_SAMPLES : (k + 1) * CHUNK_SAMPLES] for audio in speech]
        for i, piece in enumerate(pieces):
            for name, sources in (("fbank", fbanks), ("alone", alone)):
                start = time.perf_counter()
                sources[i].accept_waveform(piece)
                times[name].append(time.perf_counter() - start)
        start = time.perf_counter()
        errors = accept_waveforms(batched, pieces)
        times["batched"].append((time.perf_counter() - start) / len(pieces))
        if any(errors):
            raise next(e for e in errors if e is not None)
    return FrontendCost(num_streams, num_chunks, _median_ms(times["fbank"]),
                        _median_ms(times["alone"]), _median_ms(times["batched"]),
                        sum(f.num_frames_ready for f in fbanks),
                        sum(f.num_frames_ready for f in batched))
