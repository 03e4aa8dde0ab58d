"""Where a transcript's last sentence ends: read from the punctuation Whisper writes.

A Whisper decode of a segment that stops at a sentence's end closes it with ".", "?" or "!"
(inside a closing quote or bracket); one that stops mid-sentence ends on a word, a comma or an
ellipsis. `ends_sentence` reads that, so the engine may end a segment at a shorter pause when
the second pass says the sentence is over (`EngineConfig.sentence_end_s`).
"""

from __future__ import annotations

SENTENCE_MARKS = ".?!"
CLOSERS = "\"')]}\u201d\u2019"  # closing quotes and brackets after a sentence's mark
# titles that end in "." without ending a sentence ("... said Mr.")
TITLES = frozenset({"mr.", "mrs.", "ms.", "dr.", "st.", "prof.", "mt.", "jr.", "sr."})


def ends_sentence(text: str, min_words: int = 1) -> bool:
    """Whether ``text`` ends a sentence: it holds at least ``min_words`` words and its last
    one ends with ".", "?" or "!" (closing quotes or brackets after it aside), not with an
    ellipsis ("..." or "\u2026": speech that trails off) or a title's period ("Mr.")."""
    words = text.split()
    if len(words) < max(1, min_words):
        return False
    last = words[-1].rstrip(CLOSERS)
    return (bool(last) and last[-1] in SENTENCE_MARKS and not last.endswith("..")
            and last.lower() not in TITLES)


def unfinished_words(text: str) -> int:
    """The words of ``text``'s last sentence when ``text`` stops before its end (a segment
    cut mid-sentence: its next segment finishes that sentence); 0 when it ends one."""
    words = text.split()
    count = 0
    for word in reversed(words):
        if ends_sentence(word):
            break
        count += 1
    return count
