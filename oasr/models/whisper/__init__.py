"""Whisper (English-only checkpoints in CTranslate2 format) as a second-pass recogniser: the
``model.bin`` reader, the PyTorch model, its log-mel frontend, tokenizer and greedy decoding,
the encoder window (a segment's real length) and the no-speech rule."""

from oasr.models.whisper.config import DecodingSpec, WhisperConfig
from oasr.models.whisper.ct2_format import Ct2Model, read_ct2_model
from oasr.models.whisper.decoding import (
    BeamHypothesis,
    GreedyHypothesis,
    WhisperTranscript,
    beam_search,
    greedy_decode,
    greedy_search,
)
from oasr.models.whisper.dense_kv import DecoderKv
from oasr.models.whisper.frontend import WhisperFrontend, mel_filterbank
from oasr.models.whisper.loader import WhisperCheckpoint, default_model_dir, load_whisper
from oasr.models.whisper.model import DecoderKvStore, WhisperModel
from oasr.models.whisper.no_speech import NoSpeechRule
from oasr.models.whisper.tokenizer import WhisperTokenizer
from oasr.models.whisper.window import EncodedSegments, EncoderWindow, SegmentEncoder

__all__ = [
    "BeamHypothesis",
    "Ct2Model",
    "DecoderKv",
    "DecoderKvStore",
    "DecodingSpec",
    "EncodedSegments",
    "EncoderWindow",
    "GreedyHypothesis",
    "NoSpeechRule",
    "SegmentEncoder",
    "WhisperCheckpoint",
    "WhisperConfig",
    "WhisperFrontend",
    "WhisperModel",
    "WhisperTokenizer",
    "WhisperTranscript",
    "beam_search",
    "default_model_dir",
    "greedy_decode",
    "greedy_search",
    "load_whisper",
    "mel_filterbank",
    "read_ct2_model",
]
