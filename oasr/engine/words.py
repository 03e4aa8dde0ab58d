"""Word times of a CTC hypothesis: each word spans the frames of the tokens that spelled it."""

from __future__ import annotations

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
