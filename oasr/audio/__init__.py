"""Audio front end: client PCM decoding, resampling to 16 kHz, streaming fbank, chunk windows."""

from oasr.audio.buffered import (
    BatchExtractor,
    BufferedFeatures,
    IncrementalExtractor,
    accept_waveforms,
)
from oasr.audio.chunking import (
    ChunkGeometry,
    ChunkWindower,
    FeatureSource,
    FeatureWindow,
    FrameSource,
    split_windows,
)
from oasr.audio.energy import FrameEnergy
from oasr.audio.fbank import FbankConfig, StreamingFbank, compute_fbank
from oasr.audio.frontend import AudioFrontend, FrontendConfig
from oasr.audio.pcm import (
    F32_MAX_ABS,
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    PCM_FORMATS,
    PcmFormat,
    bytes_per_sample,
    decode_pcm,
    validate_sample_rate,
)
from oasr.audio.resample import MODEL_SAMPLE_RATE, RESAMPLE_QUALITIES, StreamingResampler
from oasr.audio.wav import read_audio

__all__ = [
    "F32_MAX_ABS",
    "MAX_SAMPLE_RATE",
    "MIN_SAMPLE_RATE",
    "MODEL_SAMPLE_RATE",
    "PCM_FORMATS",
    "RESAMPLE_QUALITIES",
    "AudioFrontend",
    "BatchExtractor",
    "BufferedFeatures",
    "ChunkGeometry",
    "ChunkWindower",
    "FbankConfig",
    "FrameEnergy",
    "FeatureSource",
    "FeatureWindow",
    "FrameSource",
    "FrontendConfig",
    "IncrementalExtractor",
    "PcmFormat",
    "StreamingFbank",
    "StreamingResampler",
    "accept_waveforms",
    "bytes_per_sample",
    "compute_fbank",
    "decode_pcm",
    "read_audio",
    "split_windows",
    "validate_sample_rate",
]
