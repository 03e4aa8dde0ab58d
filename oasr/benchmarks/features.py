"""The two frontends' cost per stream-chunk: kaldi fbank (Conformer-CTC) against the causal
log-mel (Whisper-CTC), on the same speech, fed the way the engine feeds them.

Each stream gets one extractor of each kind (`StreamingFbank`; `BufferedFeatures` around
`CausalLogMel`, exactly what `WhisperCtcFamily.new_features` builds) and receives its audio in
640 ms pieces; a piece's wall time is what the engine spends on that stream's features in one
step, before windowing. The two kinds alternate piece by piece so load bursts hit both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from oasr.audio import BufferedFeatures, StreamingFbank
from oasr.benchmarks.workload import load_speech
from oasr.models.whisper_ctc import CausalLogMel

CHUNK_SAMPLES = 10240  # 640 ms: one chunk of audio in both families


@dataclass(frozen=True)
class FrontendCost:
    """Milliseconds per stream-chunk (640 ms of audio) of each frontend.

    Attributes:
        num_streams, num_chunks: the run's size (every stream fed ``num_chunks`` pieces).
        fbank_ms: kaldi-native-fbank (80 bins, 25/10 ms), per stream-chunk, median.
        log_mel_ms: causal log-mel (80 bins, 400-point FFT, hop 160), per stream-chunk, median.
        fbank_frames, log_mel_frames: frames each produced in all (a check both did the work).
    """

    num_streams: int
    num_chunks: int
    fbank_ms: float
    log_mel_ms: float
    fbank_frames: int
    log_mel_frames: int

    @property
    def log_mel_vs_fbank(self) -> float:
        """How many times the fbank's cost the log-mel costs."""
        return self.log_mel_ms / self.fbank_ms


def measure_frontends(audio_dir: Path, num_streams: int = 16,
                      num_chunks: int = 6) -> FrontendCost:
    """Feed ``num_streams`` streams ``num_chunks`` pieces of 640 ms to both frontends."""
    speech = load_speech(audio_dir, num_streams, num_chunks * CHUNK_SAMPLES / 16000)
    fbanks = [StreamingFbank() for _ in speech]
    log_mels = [BufferedFeatures(CausalLogMel(80), 80) for _ in speech]
    fbank_s: list[float] = []
    log_mel_s: list[float] = []
    for k in range(num_chunks):
        for audio, fbank, log_mel in zip(speech, fbanks, log_mels, strict=True):
            piece = audio[k * CHUNK_SAMPLES : (k + 1) * CHUNK_SAMPLES]
            start = time.perf_counter()
            fbank.accept_waveform(piece)
            middle = time.perf_counter()
            log_mel.accept_waveform(piece)
            log_mel_s.append(time.perf_counter() - middle)
            fbank_s.append(middle - start)
    fbank_s.sort()
    log_mel_s.sort()
    return FrontendCost(num_streams, num_chunks, 1e3 * fbank_s[len(fbank_s) // 2],
                        1e3 * log_mel_s[len(log_mel_s) // 2],
                        sum(f.num_frames_ready for f in fbanks),
                        sum(f.num_frames_ready for f in log_mels))
