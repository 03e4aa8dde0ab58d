"""Language models for CTC prefix beam search (shallow fusion): a character n-gram and a word
unigram over a lexicon, each compiled to an automaton over the model's units."""

from oasr.lm.build import LmBuildConfig, build_char_lm, encode_sentences
from oasr.lm.bundle import DecoderLm, as_decoder_lm, has_decoder_lm, load_decoder_lm
from oasr.lm.model import (
    CharLmHeader,
    CharNgramLm,
    has_char_lm,
    load_char_lm,
    perplexity,
)
from oasr.lm.word import WordGains, WordLm, WordLmHeader, has_word_lm, load_word_lm

__all__ = [
    "CharLmHeader",
    "CharNgramLm",
    "DecoderLm",
    "LmBuildConfig",
    "WordGains",
    "WordLm",
    "WordLmHeader",
    "as_decoder_lm",
    "build_char_lm",
    "encode_sentences",
    "has_char_lm",
    "has_decoder_lm",
    "has_word_lm",
    "load_char_lm",
    "load_decoder_lm",
    "load_word_lm",
    "perplexity",
]
