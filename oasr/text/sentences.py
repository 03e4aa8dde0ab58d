"""Where a transcript's last sentence ends: read from the punctuation Whisper writes.

A Whisper decode of a segment that stops at a sentence's end closes it with ".", "?" or "!"
(inside a closing quote or bracket); one that stops mid-sentence ends on a word, a comma or an
ellipsis. `ends_sentence` reads that, so the engine may end a segment at a shorter pause when
the second pass says the sentence is over (`EngineConfig.sentence_end_s`).
"""

from __future__ import annotations

SENTENCE_MARKS = ".?!"
PUNCTUATION = SENTENCE_MARKS + ",;:"
# the fewest words of a transcript read as written in Whisper's unpunctuated style
UNPUNCTUATED_MIN_WORDS = 3
CLOSERS = "\"')]}\u201d\u2019"  # closing quotes and brackets after a sentence's mark
# titles that end in "." without ending a sentence ("... said Mr.")
TITLES = frozenset({"mr.", "mrs.", "ms.", "dr.", "st.", "prof.", "mt.", "jr.", "sr."})


def without_leading_marks(text: str) -> str:
    """``text`` without the punctuation marks (and spaces) it begins with. Given an unfinished
    sentence as its context, Whisper may answer the next segment with that sentence's mark
    first (". And Mr. John Dashwood ..."): the mark closes the text before, not this one."""
    return text.lstrip(PUNCTUATION + "\u2026 ")


def has_words(text: str) -> bool:
    """Whether ``text`` holds a word: a letter or a digit (Whisper answers "." or "..." for a
    cough or a breath it does not call silence)."""
    return any(char.isalnum() for char in text)


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


def as_context(text: str) -> str:
    """``text`` (a segment's final) as the transcript the next segment's decode goes on from:
    as it is, unless Whisper wrote it in its unpunctuated style (at least
    `UNPUNCTUATED_MIN_WORDS` words, no punctuation mark, no capital letter; some voices bring
    it on), which then gets a full stop. Forced as the next decode's beginning, that style
    carries on to every later final of the stream, which the sentence rule then cannot read
    (traced on flite's awb voice: "the children played outside until it was dark" as context,
    the next final "our flight was delayed by almost another" and then "... in the glass of
    water" for "and a glass"; with the full stop "Our flight was delayed by almost
    another."). The segment ended at a pause, so its sentence is taken as closed."""
    text = text.strip()
    words = text.split()
    if (len(words) < UNPUNCTUATED_MIN_WORDS or text != text.lower()
            or any(mark in text for mark in PUNCTUATION)):
        return text
    return text + "."
