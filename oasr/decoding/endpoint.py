"""Endpointing: decide from trailing blank frames when a segment of speech has ended.

The three rules are the ones WeNet and sherpa use. A frame is silence when its argmax is blank
(`FrameStats`, tracked by the decoder); a rule fires when the segment's trailing silence and
total length reach its thresholds and, if it says so, the segment contains speech:

- rule 1: a long silence, speech or not (the stream is idle: 5 s);
- rule 2: a short silence after speech (the speaker paused: 1 s);
- rule 3: the segment is long (20 s), whatever the silence, so segments stay bounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from oasr.decoding.decoder import FrameStats

_EPS = 1e-9


@dataclass(frozen=True)
class EndpointRule:
    """One rule: fires when all of its conditions hold.

    Attributes:
        must_contain_speech: only fire if some frame of the segment was not blank.
        min_trailing_silence_s: seconds of trailing blank frames needed (0 = no condition).
        min_utterance_length_s: seconds the segment must last (0 = no condition).
    """

    must_contain_speech: bool
    min_trailing_silence_s: float
    min_utterance_length_s: float = 0.0

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


def _frames(seconds: float, frame_shift_s: float) -> int:
    """Frames needed to reach ``seconds`` (exact at multiples of the frame shift)."""
    return math.ceil(seconds / frame_shift_s - _EPS)


@dataclass(frozen=True)
class EndpointConfig:
    """The three endpoint rules (each may be None to disable it) and the frame duration.

    Attributes:
        rule1: silence, with or without speech (default 5 s of trailing silence).
        rule2: silence after speech (default 1 s).
        rule3: maximum segment length (default 20 s).
        frame_shift_s: seconds per encoder frame (10 ms fbank frames subsampled 4x = 0.04).
    """

    rule1: EndpointRule | None = field(
        default_factory=lambda: EndpointRule(must_contain_speech=False, min_trailing_silence_s=5.0)
    )
    rule2: EndpointRule | None = field(
        default_factory=lambda: EndpointRule(must_contain_speech=True, min_trailing_silence_s=1.0)
    )
    rule3: EndpointRule | None = field(
        default_factory=lambda: EndpointRule(
            must_contain_speech=False, min_trailing_silence_s=0.0, min_utterance_length_s=20.0
        )
    )
    frame_shift_s: float = 0.04

    def __post_init__(self) -> None:
        if self.frame_shift_s <= 0:
            raise ValueError(f"frame_shift_s must be > 0, got {self.frame_shift_s}")

    def rules(self) -> list[tuple[str, EndpointRule]]:
        """The enabled rules in the order they are checked."""
        named = (("rule1", self.rule1), ("rule2", self.rule2), ("rule3", self.rule3))
        return [(name, rule) for name, rule in named if rule is not None]


@dataclass(frozen=True)
class Endpoint:
    """A detected endpoint.

    Attributes:
        rule: "rule1", "rule2" or "rule3".
        start_s: segment start, seconds of stream time (the segment began at the last reset).
        end_s: segment end: the end of the last decoded frame.
        speech_end_s: end of the last non-blank frame (== start_s when there was no speech).
    """

    rule: str
    start_s: float
    end_s: float
    speech_end_s: float


class Endpointer:
    """Applies an `EndpointConfig` to a stream's `FrameStats` (stateless, shared by streams).

    Thresholds are converted to whole frames once, so a rule fires exactly on the first frame
    whose count reaches its threshold, with no floating-point drift.
    """

    def __init__(self, config: EndpointConfig | None = None) -> None:
        self.config = config if config is not None else EndpointConfig()
        shift = self.config.frame_shift_s
        self._thresholds = [
            (
                name,
                rule.must_contain_speech,
                _frames(rule.min_trailing_silence_s, shift),
                _frames(rule.min_utterance_length_s, shift),
            )
            for name, rule in self.config.rules()
        ]

    def detect(self, stats: FrameStats) -> str | None:
        """The first rule (in order 1, 2, 3) that fires for this segment, else None."""
        for name, needs_speech, silence_frames, length_frames in self._thresholds:
            if needs_speech and not stats.has_speech:
                continue
            if stats.num_trailing_blank_frames < silence_frames:
                continue
            if stats.num_frames < length_frames:
                continue
            return name
        return None

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
