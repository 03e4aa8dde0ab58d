"""Word times of a CTC hypothesis: each word spans the frames of the tokens that spelled it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

# (word, start seconds, end seconds) of the stream
WordTime = tuple[str, float, float]


class _RawText(Protocol):
    def raw_text(self, ids: Sequence[int]) -> str: ...


def ctc_word_times(tokenizer: _RawText, tokens: Sequence[int], timestamps: Sequence[int],
                   base_frame: int, frame_shift_s: float) -> tuple[WordTime, ...]:
    """The hypothesis' words with the times of their first and last tokens.

    A word starts at the frame that emitted its first token and ends one frame after the frame
    of its last. Tokens' texts come from ``raw_text`` (additive over token lists, so each
    token's own text is its share of the hypothesis); whitespace separates words.

    Args:
        tokens, timestamps: the hypothesis (``len(tokens) == len(timestamps)``), frames
            counted from ``base_frame``.
        base_frame: the segment's first frame in the stream.
        frame_shift_s: seconds per encoder frame.
    """
    words: list[WordTime] = []
    chars: list[str] = []
    first = last = 0
    for token, frame in zip(tokens, timestamps, strict=True):
        for char in tokenizer.raw_text([token]):
            if char.isspace():
                if chars:
                    words.append(_word(chars, first, last, base_frame, frame_shift_s))
                    chars = []
                continue
            if not chars:
                first = frame
            chars.append(char)
            last = frame
    if chars:
        words.append(_word(chars, first, last, base_frame, frame_shift_s))
    return tuple(words)


def _word(chars: list[str], first: int, last: int, base: int, shift: float) -> WordTime:
    return "".join(chars), round((base + first) * shift, 3), round((base + last + 1) * shift, 3)


def word_probabilities(word_ends: Sequence[int], num_forced: int,
                       token_log_probs: Sequence[float]) -> tuple[float, ...]:
    """Per word of a Whisper decode, the probability of its least likely generated token.

    Args:
        word_ends: where each word ends in the decode's tokens (``WhisperTokenizer.word_ends``).
        num_forced: tokens forced before the generated ones (a word wholly among them: 1.0).
        token_log_probs: each generated token's log-probability, in order (empty: the decoder
            did not keep them, and every word is 1.0).
    """
    probs, start = [], 0
    for end in word_ends:
        span = [token_log_probs[t - num_forced]
                for t in range(max(start, num_forced), end) if t - num_forced < len(token_log_probs)]
        probs.append(math.exp(min(span)) if span else 1.0)
        start = end
    return tuple(probs)
