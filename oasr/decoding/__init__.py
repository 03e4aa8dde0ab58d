"""CTC decoding: tokenizers, the batched streaming decoder and endpointing."""

from oasr.decoding.tokenizer import (
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
    "Tokenizer",
    "load_tokenizer",
    "read_units",
    "write_units",
]
