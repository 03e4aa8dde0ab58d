"""Committed words of refined partials: LocalAgreement over consecutive refinements, and the
three parts of a partial (stable, tentative, ctc).

A word is committed once ``agreeing`` consecutive refinements all put it at the same place
after the committed prefix, compared as they are scored (``oasr.text.wer.normalize_transcript``
per word, so "man." and "man" agree), and, with a confidence floor, each of them generated
every token of it with at least that probability; a phrase a refinement says twice back to
back (`first_repeat`: Whisper's copy of the phrase before it) stays tentative, with every word
after it. The scheduling of refinements is `oasr.engine.live.refine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from oasr.decoding.words import ctc_word_times
from oasr.text.sentences import without_leading_marks
from oasr.text.wer import normalize_transcript

MAX_REPEAT_WORDS = 8


def _key(word: str) -> str:
    return normalize_transcript(word) or word.lower()


def first_repeat(keys: Sequence[str], after: int = 0) -> int:
    """Where the first phrase that ``keys`` says back to back begins: two to
    `MAX_REPEAT_WORDS` words said twice in a row, or one word three times; only repeats that
    reach past ``after`` count. ``len(keys)`` when there is none.

    Whisper copies a phrase it has just written when the next one starts alike ("It was the
    epoch of belief, it was the epoch of incredulity" read as "It was the upper conceit. It
    was the upper conceit."), and two refinements of a second more audio often make the same
    copy; the final, decoding the whole segment with beam search, does not. Committed words
    are forced into the final, so a copy must not become committed; a phrase a speaker truly
    repeats then stays tentative until the final, which writes it as it hears it."""
    n = len(keys)
    for i in range(n):
        for size in range(1, min(MAX_REPEAT_WORDS, (n - i) // 2) + 1):
            copies = 3 if size == 1 else 2
            end = i + copies * size
            if end > n or end <= after:
                continue
            phrase = keys[i:i + size]
            if all(keys[i + c * size: i + (c + 1) * size] == phrase for c in range(1, copies)):
                return i
    return n


@dataclass
class LocalAgreement:
    """One segment's committed words (the invariant: ``committed`` only ever grows).

    Attributes:
        committed: the stable words, as first written.
        latest: the newest refinement's words (it begins with ``committed``).
        agreeing: refinements in a row that must agree on a word to commit it (2: the newest
            and the one before it).
        hold_words: an agreed word among the last this many words of the oldest agreeing
            refinement is not committed yet: that decode heard it at the end of its audio.
    """

    committed: list[str] = field(default_factory=list)
    latest: list[str] = field(default_factory=list)
    agreeing: int = 2
    hold_words: int = 0
    # the last ``agreeing - 1`` refinements' words as compared (None: a word its decoder was
    # unsure of, which agrees with nothing), oldest first
    _history: list[list[str | None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.agreeing < 2 or self.hold_words < 0:
            raise ValueError(f"LocalAgreement needs agreeing >= 2 and hold_words >= 0, got "
                             f"{self.agreeing} and {self.hold_words}")

    def update(self, words: Sequence[str], commit: bool = True,
               sure: Sequence[bool] | None = None) -> bool:
        """A new refinement's words (which begin with the committed ones): commit what it
        and the ``agreeing - 1`` refinements before it agree on after the committed prefix,
        up to the first phrase any of them repeats back to back (`first_repeat`), short of
        the oldest one's last ``hold_words`` words, and up to a word one of them was not
        ``sure`` of (per word; None: sure of all). Nothing is committed when not ``commit``:
        the words only become the latest. False (and nothing changes) when the words do not
        begin with the committed ones."""
        words = list(words)
        n = len(self.committed)
        keys = [_key(w) for w in words]
        if keys[:n] != [_key(w) for w in self.committed]:
            return False  # not built on the committed prefix (a decode that failed to keep it)
        compared = [k if sure is None or i >= len(sure) or sure[i] else None
                    for i, k in enumerate(keys)]
        agreed = n
        if commit and len(self._history) >= self.agreeing - 1:
            others = self._history[len(self._history) - self.agreeing + 1:]
            limit = min(first_repeat([k or "" for k in ks], n) for ks in [compared, *others])
            limit = min(limit, len(others[0]) - self.hold_words)
            while (agreed < limit and compared[agreed] is not None
                   and all(k[agreed] == compared[agreed] for k in others)):
                agreed += 1
        self.committed += words[n:agreed]
        self.latest = words
        self._history = [*self._history, compared][-(self.agreeing - 1):]
        return True

    @property
    def tentative(self) -> list[str]:
        return self.latest[len(self.committed):]

    def reset(self) -> None:
        self.committed.clear()
        self.latest.clear()
        self._history.clear()


@dataclass
class RefineState:
    """A stream's refinement bookkeeping for its open segment (engine thread only).

    Attributes:
        agreement: the committed / tentative words.
        prefix_tokens: Whisper tokens of ``agreement.committed`` (forced at the next decode).
        draft_tokens: Whisper tokens of the newest decode's words after the committed ones
            (``agreement.tentative``): the next refinement's greedy decode takes them where
            each is its own choice, in its prompt's decoder call (`RefineJob.draft`).
        in_flight: the job id of the refinement being decoded, or None.
        refined_frames: segment-relative encoder frames the newest refinement saw.
        requested_frames: ... the one in flight (or the newest) was asked for.
        refined_at: monotonic time of the newest refinement's request (oldest goes first).
        last_token_frame: segment-relative encoder frame after the newest CTC token.
        num_refinements: refinements applied in this stream.
    """

    agreement: LocalAgreement = field(default_factory=LocalAgreement)
    prefix_tokens: tuple[int, ...] = ()
    draft_tokens: tuple[int, ...] = ()
    in_flight: int | None = None
    refined_frames: int = 0
    requested_frames: int = 0
    refined_at: float = 0.0
    last_token_frame: int = 0
    num_refinements: int = 0

    def reset(self) -> None:
        """A new segment: nothing refined or committed (a refinement in flight is stale)."""
        self.agreement.reset()
        self.prefix_tokens = self.draft_tokens = ()
        self.in_flight = None
        self.refined_frames = self.requested_frames = self.last_token_frame = 0


@dataclass(frozen=True)
class RefinedPartial:
    """The three parts of a partial, each a space-joined run of words."""

    stable: str
    tentative: str
    ctc: str

    @property
    def text(self) -> str:
        return " ".join(part for part in (self.stable, self.tentative, self.ctc) if part)

    def from_first_word(self) -> RefinedPartial:
        """The partial without the marks its text begins with (`without_leading_marks`: a
        refinement after an unfinished context may begin with that sentence's full stop)."""
        for name in ("stable", "tentative", "ctc"):
            part = getattr(self, name)
            if part:  # the first part with text begins the partial
                kept = without_leading_marks(part)
                return self if kept == part else replace(self, **{name: kept})
        return self


NO_WORDS = RefinedPartial("", "", "")  # what a segment shows before its first word


def word_start_frames(tokenizer: Any, tokens: Sequence[int],
                      timestamps: Sequence[int]) -> list[int]:
    """The frame each word of a CTC hypothesis starts at (``oasr.decoding.words``' word times,
    counted in frames)."""
    return [int(start) for _, start, _ in ctc_word_times(tokenizer, tokens, timestamps, 0, 1.0)]


def compose(state: RefineState | None, ctc_text: str, ctc_starts: Sequence[int],
            lag_frames: int = 0) -> RefinedPartial:
    """A partial from the refinement state and the current CTC hypothesis (its words and the
    frame each starts at, segment-relative): the CTC words that start ``lag_frames`` or more
    after the refined audio follow the refined ones."""
    if state is None or not state.agreement.latest:
        return RefinedPartial("", "", ctc_text)
    words = ctc_text.split()
    if len(words) == len(ctc_starts):
        tail = [w for w, start in zip(words, ctc_starts, strict=True)
                if start >= state.refined_frames + lag_frames]
    else:  # the text's words and the tokens' words disagree (special units): no CTC tail
        tail = []
    return RefinedPartial(" ".join(state.agreement.committed),
                          " ".join(state.agreement.tentative), " ".join(tail))
