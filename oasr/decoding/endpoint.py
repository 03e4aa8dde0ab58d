"""Endpointing: decide from the CTC output when a segment of speech has ended, and where.

A frame is silence when its argmax is blank (`FrameStats`, tracked by the decoder); a pause is
a gap between the best hypothesis's speech tokens (their frames, `Hypothesis.timestamps`). A
rule fires when its silence, the segment's length and the words before the silence reach its
thresholds. The defaults follow read speech, measured on joined LibriVox passages and on
paragraphs read by TTS voices (`bench/segments.py`, docs/architecture.md): a breath inside a
sentence lasts 0.2-0.4 s, a pause between sentences 0.6-1.2 s.

- rule 1: a long silence, speech or not (the stream is idle: 5 s);
- rule 2: a sentence pause (0.8 s of blank frames: a blank run outlasts the acoustic pause by
  the letters' spike lag) after at least 3 words;
- rule 4: a longer silence (1.2 s) after fewer words ("yes."), so a word read after a
  pause does not end alone at the sentence's end;
- rule 3: the segment is long (15 s), whatever the silence: the engine then cuts at the
  quietest point of the last ``max_cut_window_s`` (`quietest_frame`), not at the chunk's end.

A rule 2 pause shorter than rule 4's silence is decided when it is certain: when more than
``tail_words`` (1) words follow it, the segment ends in the middle of the pause; when one word
follows and then another pause, that word stays and the segment ends at the later pause (a
reader's pause before a sentence's last word does not cut the word off alone). Either way the
cut may lie before the latest chunk: the engine re-decodes the frames after it as the next
segment's first (`ASREngine._end_segment`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from oasr.decoding.decoder import FrameStats

_EPS = 1e-9


@dataclass(frozen=True)
class EndpointRule:
    """One rule: fires when all of its conditions hold.

    Attributes:
        must_contain_speech: only fire if some frame of the segment was not blank.
        min_trailing_silence_s: seconds of silence needed (0 = no condition): trailing
            blank frames, or (with ``min_words`` > 0) a pause between the hypothesis's words.
        min_utterance_length_s: seconds the segment must last (0 = no condition).
        min_words: words the hypothesis must hold before the silence (0 = no condition).
    """

    must_contain_speech: bool
    min_trailing_silence_s: float
    min_utterance_length_s: float = 0.0
    min_words: int = 0

    def __post_init__(self) -> None:
        if self.min_trailing_silence_s < 0 or self.min_utterance_length_s < 0:
            raise ValueError(
                f"endpoint thresholds must be >= 0 s, got trailing silence "
                f"{self.min_trailing_silence_s} and utterance length {self.min_utterance_length_s}"
            )
        if self.min_trailing_silence_s == 0 and self.min_utterance_length_s == 0:
            raise ValueError(
                "an endpoint rule with no silence and no length threshold fires on every frame; "
                "set min_trailing_silence_s or min_utterance_length_s > 0 "
                "(or disable the rule with None)"
            )
        if self.min_words < 0:
            raise ValueError(f"min_words must be >= 0, got {self.min_words}")
        if self.min_words > 0 and (self.min_trailing_silence_s == 0 or not self.must_contain_speech):
            raise ValueError(
                f"min_words {self.min_words} needs a speech rule with a silence: set "
                f"must_contain_speech=True and min_trailing_silence_s > 0 (got "
                f"{self.must_contain_speech}, {self.min_trailing_silence_s})")


def _frames(seconds: float, frame_shift_s: float) -> int:
    """Frames needed to reach ``seconds`` (exact at multiples of the frame shift)."""
    return math.ceil(seconds / frame_shift_s - _EPS)


@dataclass(frozen=True)
class EndpointConfig:
    """The endpoint rules (each may be None to disable it) and the frame duration.

    Attributes:
        rule1: silence, with or without speech (default 5 s of trailing silence).
        rule2: a pause after enough words (default 0.8 s after 3 words).
        rule3: maximum segment length (default 15 s).
        rule4: a longer silence after any speech (default 1.2 s).
        max_cut_window_s: when rule 3 fires, the segment ends at the quietest frame of this
            many last seconds, clipped to the segment (0 = at the chunk's end, wherever that
            falls). Also how far back a rule 2 decision may be deferred.
        tail_words: up to this many words read after a rule 2 pause and followed by another
            pause stay in the segment (a sentence's last word after a pause is not cut off
            alone): a pause shorter than rule 4's silence is decided only when the speech
            after it holds more words, or another pause ends them (0 = decide at once).
        frame_shift_s: seconds per encoder frame (10 ms fbank frames subsampled 4x = 0.04).
    """

    rule1: EndpointRule | None = field(
        default_factory=lambda: EndpointRule(must_contain_speech=False, min_trailing_silence_s=5.0)
    )
    rule2: EndpointRule | None = field(
        default_factory=lambda: EndpointRule(must_contain_speech=True, min_trailing_silence_s=0.8,
                                             min_words=3)
    )
    rule3: EndpointRule | None = field(
        default_factory=lambda: EndpointRule(
            must_contain_speech=False, min_trailing_silence_s=0.0, min_utterance_length_s=15.0
        )
    )
    rule4: EndpointRule | None = field(
        default_factory=lambda: EndpointRule(must_contain_speech=True, min_trailing_silence_s=1.2)
    )
    max_cut_window_s: float = 3.0
    tail_words: int = 1
    frame_shift_s: float = 0.04

    def __post_init__(self) -> None:
        if self.frame_shift_s <= 0:
            raise ValueError(f"frame_shift_s must be > 0, got {self.frame_shift_s}")
        if self.max_cut_window_s < 0:
            raise ValueError(f"max_cut_window_s must be >= 0, got {self.max_cut_window_s}")
        if self.tail_words < 0:
            raise ValueError(f"tail_words must be >= 0, got {self.tail_words}")

    @classmethod
    def wenet(cls) -> EndpointConfig:
        """WeNet's and sherpa's rules (oasr's defaults before they were tuned on read speech):
        5 s of silence, 1 s of silence after speech, 20 s of segment cut at the chunk's end."""
        return cls(rule2=EndpointRule(must_contain_speech=True, min_trailing_silence_s=1.0),
                   rule3=EndpointRule(must_contain_speech=False, min_trailing_silence_s=0.0,
                                      min_utterance_length_s=20.0),
                   rule4=None, max_cut_window_s=0.0, tail_words=0)

    @classmethod
    def wenet_quiet_cut(cls) -> EndpointConfig:
        """oasr's default: WeNet's silence rules (5 s; 1 s after speech), and a segment that
        reaches 20 s without such a pause ends at the quietest point of its last 3 s, not at
        the chunk's end, which falls mid-word as often as not (the frames after the cut start
        the next segment). Over 2,500 words paced as live streams (bench/paced_endpoints.py, 7
        length cuts, all in the long read passages) the finals made 183 word errors against
        194 with WeNet's cut, and 183 against 191 with the previous segment as context; 15 s
        segments cut so made 213."""
        return replace(cls.wenet(), max_cut_window_s=3.0)

    def rules(self) -> list[tuple[str, EndpointRule]]:
        """The enabled rules in the order they are checked (1, 2, 4, 3)."""
        named = (("rule1", self.rule1), ("rule2", self.rule2), ("rule4", self.rule4),
                 ("rule3", self.rule3))
        return [(name, rule) for name, rule in named if rule is not None]


@dataclass(frozen=True)
class Endpoint:
    """A detected endpoint.

    Attributes:
        rule: "rule1", "rule2", "rule3" or "rule4".
        start_s: segment start, seconds of stream time (the segment began at the last reset).
        end_s: segment end: the end of the last decoded frame.
        speech_end_s: end of the last non-blank frame (== start_s when there was no speech).
    """

    rule: str
    start_s: float
    end_s: float
    speech_end_s: float


@dataclass(frozen=True)
class EndpointDecision:
    """A rule fired: end the segment after ``cut_frame`` frames (counted from its reset).

    ``cut_frame`` equals the frames decoded when the segment ends now; it is smaller when the
    pause lies inside the latest chunk (rule 2), and rule 3's cut is left to the engine
    (``is_length_cut``: find the quietest frame).
    """

    rule: str
    cut_frame: int
    is_length_cut: bool = False


class Endpointer:
    """Applies an `EndpointConfig` to a stream's `FrameStats` and best hypothesis (stateless,
    shared by streams).

    Thresholds are converted to whole frames once, so a rule fires exactly on the first frame
    whose count reaches its threshold, with no floating-point drift.

    Args:
        separator_ids: token ids that separate words and are not speech (the char models'
            word boundary); words are runs of the other tokens.
    """

    def __init__(self, config: EndpointConfig | None = None,
                 separator_ids: Sequence[int] = ()) -> None:
        self.config = config if config is not None else EndpointConfig()
        shift = self.config.frame_shift_s
        self.separator_ids = frozenset(separator_ids)
        self._thresholds = [
            (
                name,
                rule.must_contain_speech,
                _frames(rule.min_trailing_silence_s, shift),
                _frames(rule.min_utterance_length_s, shift),
                rule.min_words,
            )
            for name, rule in self.config.rules()
        ]
        self.max_cut_window_frames = _frames(self.config.max_cut_window_s, shift)
        rule4 = self.config.rule4
        # a pause this long is a sentence's end whatever follows: no need to wait and see
        self.sure_pause_frames = (_frames(rule4.min_trailing_silence_s, shift)
                                  if rule4 is not None and self.config.tail_words else 0)

    def is_silence_rule(self, name: str) -> bool:
        """Whether rule ``name`` fires on a silence (not on the segment's length alone)."""
        return any(n == name and silence > 0 for n, _, silence, _, _ in self._thresholds)

    def detect(self, stats: FrameStats) -> str | None:
        """The first rule (in order 1, 2, 4, 3) whose trailing silence and length hold; a
        rule with ``min_words`` needs `decide` (the words) and is skipped here."""
        for name, needs_speech, silence_frames, length_frames, min_words in self._thresholds:
            if min_words or (needs_speech and not stats.has_speech):
                continue
            if stats.num_trailing_blank_frames < silence_frames:
                continue
            if stats.num_frames < length_frames:
                continue
            return name
        return None

    def decide(self, stats: FrameStats, tokens: Sequence[int],
               timestamps: Sequence[int]) -> EndpointDecision | None:
        """Whether the segment ends, and after which frame.

        Args:
            stats: the stream's counters since its last reset.
            tokens, timestamps: its best hypothesis (token ids and their frames).
        """
        for name, needs_speech, silence_frames, length_frames, min_words in self._thresholds:
            if needs_speech and not stats.has_speech:
                continue
            if stats.num_frames < length_frames:
                continue
            if min_words:
                cut = self._pause_cut(stats, tokens, timestamps, silence_frames, min_words)
                if cut is not None:
                    return EndpointDecision(name, cut)
                continue
            if stats.num_trailing_blank_frames < silence_frames:
                continue
            is_length_cut = silence_frames == 0 and self.max_cut_window_frames > 0
            return EndpointDecision(name, stats.num_frames, is_length_cut)
        return None

    def _pause_cut(self, stats: FrameStats, tokens: Sequence[int], timestamps: Sequence[int],
                   silence_frames: int, min_words: int) -> int | None:
        """Where the first pause of ``silence_frames`` after ``min_words`` words ends the
        segment (the chunk's end for a trailing pause, else the pause's middle), once that is
        certain; None while it is not (or there is no such pause).

        A pause is certain when it lasts ``sure_pause_frames``, when more than ``tail_words``
        words follow it, or when it is too old to wait for (``max_cut_window_frames``). When
        at most ``tail_words`` words follow it and then another pause, those words stay: the
        segment ends at that later pause.
        """
        words = self._speech_words(tokens, timestamps, silence_frames)  # [(first, last frame)]
        for i in range(min_words, len(words) + 1):
            end = words[i - 1][1]
            if i < len(words):
                gap = words[i][0] - end - 1
                if gap < silence_frames:
                    continue
                cut = end + 1 + gap // 2
                later = words[i:]
            else:  # trailing
                gap = stats.num_trailing_blank_frames
                if gap < silence_frames:
                    return None
                cut, later = stats.num_frames, []
            if not later:
                return cut if not self.sure_pause_frames or gap >= self.sure_pause_frames else None
            if gap >= self.sure_pause_frames or stats.num_frames - cut >= self.max_cut_window_frames:
                return cut
            return self._after_tail(stats, later, silence_frames, cut)
        return None

    def _after_tail(self, stats: FrameStats, later: list[tuple[int, int]], silence_frames: int,
                    pause_cut: int) -> int | None:
        """The words after a pause: more than ``tail_words`` before the next pause, the pause
        ends the segment (``pause_cut``); fewer, and then another pause, they stay and that
        pause ends it; else wait."""
        run = 1  # words before the next pause
        while run < len(later) and later[run][0] - later[run - 1][1] - 1 < silence_frames:
            run += 1
        if run > self.config.tail_words:
            return pause_cut
        end = later[run - 1][1]
        if run < len(later):
            return end + 1 + (later[run][0] - end - 1) // 2
        if stats.num_trailing_blank_frames >= silence_frames:
            return stats.num_frames
        return None

    def _speech_words(self, tokens: Sequence[int], timestamps: Sequence[int],
                      silence_frames: int) -> list[tuple[int, int]]:
        """(first, last) frame of each word: runs of speech tokens split by separators or by a
        gap of ``silence_frames`` (a pause inside a word the model did not mark)."""
        words: list[tuple[int, int]] = []
        boundary = True
        for tok, frame in zip(tokens, timestamps, strict=True):
            if tok in self.separator_ids:
                boundary = True
                continue
            if boundary or frame - words[-1][1] - 1 >= silence_frames:
                words.append((frame, frame))
            else:
                words[-1] = (words[-1][0], frame)
            boundary = False
        return words

    def endpoint(self, stats: FrameStats, segment_start_s: float = 0.0) -> Endpoint | None:
        """`detect`, plus the segment's times when a rule fires.

        Args:
            stats: the stream's counters since its last reset.
            segment_start_s: stream time (seconds) of that reset.
        """
        rule = self.detect(stats)
        if rule is None:
            return None
        shift = self.config.frame_shift_s
        end_s = segment_start_s + stats.num_frames * shift
        speech_frames = (
            stats.num_frames - stats.num_trailing_blank_frames if stats.has_speech else 0
        )
        return Endpoint(
            rule=rule,
            start_s=segment_start_s,
            end_s=end_s,
            speech_end_s=segment_start_s + speech_frames * shift,
        )


def quiet_middle(frame_energy_db: np.ndarray, margin_db: float = 6.0,
                 smooth_frames: int = 5) -> int:
    """Index of the middle of the quietest pause of ``frame_energy_db`` (F,): the run of
    frames around the quietest one (`quietest_frame`) whose smoothed energy stays within
    ``margin_db`` of it, and the frame halfway along it. In digital silence that is the
    middle of the whole silence, not its last frame before the next sound."""
    energy = np.asarray(frame_energy_db, dtype=np.float64)
    if energy.size == 0:
        raise ValueError("quiet_middle needs at least one frame")
    smooth = _smoothed(energy, smooth_frames)
    quietest = _latest_minimum(smooth)
    quiet = smooth <= smooth[quietest] + margin_db
    first = last = quietest
    while first > 0 and quiet[first - 1]:
        first -= 1
    while last + 1 < energy.size and quiet[last + 1]:
        last += 1
    return (first + last) // 2


def _smoothed(energy: np.ndarray, smooth_frames: int) -> np.ndarray:
    """The mean of ``smooth_frames`` frames centred on each frame (edges repeated)."""
    k = max(1, min(smooth_frames, energy.size))
    padded = np.pad(energy, (k // 2, k - 1 - k // 2), mode="edge")
    return np.convolve(padded, np.ones(k) / k, mode="valid")  # (F,)


def _latest_minimum(values: np.ndarray) -> int:
    """Index of the smallest value, the latest one on ties."""
    return int(values.size - 1 - np.argmin(values[::-1]))


def quietest_frame(frame_energy_db: np.ndarray, smooth_frames: int = 5) -> int:
    """Index of the quietest frame of ``frame_energy_db`` (F,): the lowest mean energy over
    ``smooth_frames`` frames centred on it (a pause, not one quiet frame inside a word); the
    latest such frame on ties."""
    energy = np.asarray(frame_energy_db, dtype=np.float64)
    if energy.size == 0:
        raise ValueError("quietest_frame needs at least one frame")
    return _latest_minimum(_smoothed(energy, smooth_frames))
