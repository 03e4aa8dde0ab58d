"""Word times of a CTC hypothesis (what word timestamps of the transcription API build on)."""

from __future__ import annotations

from oasr.decoding.words import ctc_word_times
from oasr.text.tokenizer import CharTokenizer

UNITS = ["<blank>", "<unk>", "\u2581", *"abcdefghijklmnopqrstuvwxyz'", "<sos/eos>"]


def test_words_span_their_tokens_frames() -> None:
    tokenizer = CharTokenizer(UNITS)
    tokens = tokenizer.encode("hi you")  # h i ▁ y o u
    timestamps = [3, 4, 6, 10, 11, 15]
    words = ctc_word_times(tokenizer, tokens, timestamps, base_frame=100, frame_shift_s=0.04)
    # 'hi': frames 103..104 -> 4.12..4.2 s; 'you': frames 110..115 -> 4.4..4.64 s
    assert words == (("hi", 4.12, 4.2), ("you", 4.4, 4.64))


def test_no_tokens_no_words() -> None:
    assert ctc_word_times(CharTokenizer(UNITS), [], [], 0, 0.04) == ()
