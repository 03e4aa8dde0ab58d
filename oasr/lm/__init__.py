"""Character n-gram language models for CTC prefix beam search (shallow fusion)."""

from oasr.lm.build import LmBuildConfig, build_char_lm, encode_sentences
from oasr.lm.model import (
    CharLmHeader,
    CharNgramLm,
    has_char_lm,
    load_char_lm,
    perplexity,
)

__all__ = [
    "CharLmHeader",
    "CharNgramLm",
    "LmBuildConfig",
    "build_char_lm",
    "encode_sentences",
    "has_char_lm",
    "load_char_lm",
    "perplexity",
]
