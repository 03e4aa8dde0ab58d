"""Text, the bottom layer: token ids <-> text (`tokenizer`) and transcript scoring (`wer`).

Pure Python over strings and files; every layer above may import it, and it imports no other
part of oasr.
"""

from oasr.text.tokenizer import (
    BpeTokenizer,
    CharTokenizer,
    Tokenizer,
    clean_text,
    load_tokenizer,
    read_units,
    write_units,
)
from oasr.text.wer import ErrorCounts, edit_distance, normalize_transcript, word_error_rate

__all__ = [
    "BpeTokenizer",
    "CharTokenizer",
    "ErrorCounts",
    "Tokenizer",
    "clean_text",
    "edit_distance",
    "load_tokenizer",
    "normalize_transcript",
    "read_units",
    "word_error_rate",
    "write_units",
]
