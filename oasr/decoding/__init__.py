"""CTC decoding: the batched streaming decoder and endpointing (tokenizers from `oasr.text`)."""

from oasr.decoding.config import GpuDecoderConfig, Hypothesis
from oasr.decoding.decoder import FrameStats, GpuStreamingDecoder, StreamStep
from oasr.decoding.endpoint import (
    Endpoint,
    EndpointConfig,
    EndpointDecision,
    Endpointer,
    EndpointRule,
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
    "GpuDecoderConfig",
    "GpuStreamingDecoder",
    "Hypothesis",
    "StreamStep",
    "Tokenizer",
    "load_tokenizer",
    "quietest_frame",
    "read_units",
    "write_units",
]
