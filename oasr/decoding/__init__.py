"""CTC decoding: the batched streaming decoder and endpointing (tokenizers from `oasr.text`)."""

from oasr.decoding.config import DecoderConfig, Hypothesis
from oasr.decoding.decoder import FrameStats, GpuDecoderConfig, GpuStreamingDecoder, StreamStep
from oasr.decoding.endpoint import (
    Endpoint,
    EndpointConfig,
    EndpointDecision,
    Endpointer,
    EndpointRule,
    quiet_middle,
    quietest_frame,
)
from oasr.decoding.state import DecoderState
from oasr.text.tokenizer import (
    BpeTokenizer,
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
    read_units,
    write_units,
)

__all__ = [
    "BpeTokenizer",
    "CharTokenizer",
    "DecoderState",
    "Endpoint",
    "EndpointConfig",
    "EndpointDecision",
    "EndpointRule",
    "Endpointer",
    "FrameStats",
    "DecoderConfig",
    "GpuDecoderConfig",
    "GpuStreamingDecoder",
    "Hypothesis",
    "StreamStep",
    "Tokenizer",
    "load_tokenizer",
    "quiet_middle",
    "quietest_frame",
    "read_units",
    "write_units",
]
