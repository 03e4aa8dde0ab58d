"""The two frontends' cost per stream-chunk: kaldi fbank (Conformer-CTC) against the causal
log-mel (Whisper-CTC), on the same speech, fed the way the engine feeds them.

Each stream gets one extractor of each kind (`StreamingFbank`; `BufferedFeatures` around
`CausalLogMel`, exactly what `WhisperCtcFamily.new_features` builds) and receives its audio in
640 ms pieces; a piece's wall time is what the engine spends on that stream's features in one
step, before windowing. The kinds alternate piece by piece so load bursts hit all alike.

The causal log-mel projects its power spectra onto the mel filters with a numpy matmul, so its
cost depends on numpy's BLAS thread pool: it is timed twice, with the pool at one thread per
core (numpy's default) and at one thread (`oasr bench --threads 1`'s setting).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oasr.audio import BufferedFeatures, StreamingFbank
from oasr.benchmarks.workload import load_speech
from oasr.models.whisper_ctc import CausalLogMel

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
        fbank_ms: kaldi-native-fbank (80 bins, 25/10 ms).
        log_mel_ms: causal log-mel (80 bins, 400-point FFT, hop 160), numpy's BLAS pool at
            ``blas_threads_default`` threads.
        log_mel_one_thread_ms: the same with numpy's BLAS pool at one thread.
        blas_threads_default: the default pool size (None: threadpoolctl missing, not set).
        fbank_frames, log_mel_frames: frames each produced in all (a check both did the work).
    """

    num_streams: int
    num_chunks: int
    fbank_ms: float
    log_mel_ms: float
    log_mel_one_thread_ms: float
    blas_threads_default: int | None
    fbank_frames: int
    log_mel_frames: int

    @property
    def log_mel_vs_fbank(self) -> float:
        """How many times the fbank's cost the log-mel costs (one BLAS thread)."""
        return self.log_mel_one_thread_ms / self.fbank_ms


def _median_ms(seconds: list[float]) -> float:
    return 1e3 * float(np.median(seconds))


def measure_frontends(audio_dir: Path, num_streams: int = 16,
                      num_chunks: int = 6) -> FrontendCost:
    """Feed ``num_streams`` streams ``num_chunks`` pieces of 640 ms to every frontend."""
    speech = load_speech(audio_dir, num_streams, num_chunks * CHUNK_SAMPLES / 16000)
    fbanks = [StreamingFbank() for _ in speech]
    log_mels = {n: [BufferedFeatures(CausalLogMel(80), 80) for _ in speech]
                for n in ("default", "one")}
    cores = os.cpu_count() or 1
    times: dict[str, list[float]] = {"fbank": [], "default": [], "one": []}
    for k in range(num_chunks):
        for i, audio in enumerate(speech):
            piece = audio[k * CHUNK_SAMPLES : (k + 1) * CHUNK_SAMPLES]
            start = time.perf_counter()
            fbanks[i].accept_waveform(piece)
            times["fbank"].append(time.perf_counter() - start)
            for name, threads in (("default", cores), ("one", 1)):
                with blas_threads(threads):
                    start = time.perf_counter()
                    log_mels[name][i].accept_waveform(piece)
                    times[name].append(time.perf_counter() - start)
    with blas_threads(cores) as default:
        pass
    return FrontendCost(num_streams, num_chunks, _median_ms(times["fbank"]),
                        _median_ms(times["default"]), _median_ms(times["one"]), default,
                        sum(f.num_frames_ready for f in fbanks),
                        sum(f.num_frames_ready for f in log_mels["one"]))
