"""oasr: a streaming speech-recognition serving engine (paged K/V cache, batched chunked
Conformer-CTC, live websocket demo)."""

from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder

__all__ = ["GpuDecoderConfig", "GpuStreamingDecoder"]
__version__ = "0.1.0"
