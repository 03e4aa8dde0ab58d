"""Whisper's own safeguards against runaway decoding, as the reference decoders apply them.

Greedy Whisper sometimes falls into a loop ("8, 8, 8, 8, ..." until the 448-position window is
full) or invents fluent text for a short, odd segment. The reference implementation and
faster-whisper guard a segment's decode with the same three rules, built here:

- **temperature fallback**: decode at temperature 0; when the text compresses too well (zlib
  ratio above 2.4: a loop) or its average log-probability is below -1.0, decode again by
  sampling at 0.2, 0.4, ... 1.0 (``best_of`` samples per temperature, the likeliest kept; the
  lowest temperature that passes wins), unless the no-speech probability says the segment is
  silence;
- **a token budget from the segment's duration**: a 4 s segment cannot need 224 tokens, so a
  row stops at ``TokenBudget.max_tokens(num_samples)``;
- **early stop on repetition**: a row whose last tokens repeat one short pattern over and over
  stops at once (``RepetitionStop``) instead of running to its budget, and counts as failed.

A decode that still fails after the last temperature is marked ``failed``: the engine's guard
against the first pass (``oasr.engine.second_pass.guard``) then keeps the CTC text.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from oasr.models.whisper.frontend import SAMPLE_RATE

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def compression_ratio(text: str) -> float:
    """len(utf-8 bytes) / len(zlib-compressed bytes): about 1 for normal text (below 1 for a
    few words), above 2.4 for text that repeats itself; 0 for ""."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass(frozen=True)
class TokenBudget:
    """Tokens a segment of a given duration may generate: ``base + per_second * seconds``.

    Calibrated on faster-whisper's own transcripts of the devset and the stress set
    (``bench/second_pass_parity.py``): the densest file needed 6.8 tokens per second
    (a 1.3 s fluent digit string with a comma after each digit), so 12 per second plus 16
    leaves room for any real speech and still cuts a 4 s segment's loop at 64 tokens instead
    of the 446 positions it ran to.

    Attributes:
        per_second: tokens per second of audio.
        base: tokens every segment gets (a one-word segment with punctuation).
    """

    per_second: float = 12.0
    base: int = 16

    def __post_init__(self) -> None:
        if not self.per_second > 0:
            raise ValueError(f"TokenBudget.per_second must be > 0, got {self.per_second}")
        if self.base < 1:
            raise ValueError(f"TokenBudget.base must be >= 1, got {self.base}")

    def max_tokens(self, num_samples: int, ceiling: int) -> int:
        """Tokens for a segment of ``num_samples`` 16 kHz samples, at most ``ceiling``."""
        wanted = self.base + math.ceil(self.per_second * num_samples / SAMPLE_RATE)
        return max(1, min(ceiling, wanted))


@dataclass(frozen=True)
class RepetitionStop:
    """Stop a row whose tail is one pattern of ``period`` tokens repeated back to back.

    A pattern of p tokens must repeat ``max(min_repeats, ceil(min_span / p))`` times: "9, 9, 9"
    (p = 2, three times) or a phrase said twice is speech, "8, 8, 8, 8, 8, 8" is a loop.

    Attributes:
        max_period: longest pattern looked for, in tokens.
        min_repeats: fewest back-to-back copies of any pattern that count as a loop.
        min_span: fewest tokens the copies must cover (so short patterns need more copies).
    """

    max_period: int = 16
    min_repeats: int = 3
    min_span: int = 12

    def __post_init__(self) -> None:
        if self.max_period < 1 or self.min_repeats < 2 or self.min_span < 2:
            raise ValueError(
                f"RepetitionStop needs max_period >= 1, min_repeats >= 2, min_span >= 2; got "
                f"{self.max_period}, {self.min_repeats}, {self.min_span}"
            )

    def copies_needed(self, period: int) -> int:
        return max(self.min_repeats, math.ceil(self.min_span / period))

    def is_looping(self, tokens: Sequence[int]) -> bool:
        """True when ``tokens`` ends in a loop (checked after each new token: only patterns
        that end at the last token are looked for)."""
        n = len(tokens)
        for period in range(1, min(self.max_period, n // self.min_repeats) + 1):
            needed = self.copies_needed(period)
            if period * needed > n or tokens[-1] != tokens[-1 - period]:
                continue
            tail = tokens[n - period:]
            if all(tokens[n - (c + 1) * period: n - c * period] == tail for c in range(1, needed)):
                return True
        return False


@dataclass(frozen=True)
class FallbackRule:
    """When a decode is redone at the next temperature (the reference decoders' rule).

    Attributes:
        temperatures: tried in order; 0 is greedy, above 0 samples ``best_of`` candidates.
        compression_ratio_threshold: text compressing better than this is a loop.
        log_prob_threshold: an average log-probability below this is a poor decode ...
        no_speech_threshold: ... unless the no-speech probability is above this (the segment
            is silence: no fallback, the no-speech rule decides).
        best_of: samples per temperature above 0; the one with the highest average
            log-probability is kept.
    """

    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    compression_ratio_threshold: float = 2.4
    log_prob_threshold: float = -1.0
    no_speech_threshold: float = 0.6
    best_of: int = 5

    def __post_init__(self) -> None:
        temps = self.temperatures
        if not temps or any(not 0.0 <= t <= 2.0 for t in temps) or list(temps) != sorted(temps):
            raise ValueError(f"FallbackRule.temperatures must be ascending values in 0..2, got {temps}")
        if self.best_of < 1:
            raise ValueError(f"FallbackRule.best_of must be >= 1, got {self.best_of}")

    def is_failed(self, decode: DecodeAttempt) -> bool:
        """The decode needs another try (or, after the last temperature, is not to be trusted)."""
        if decode.looped or decode.truncated:
            return True
        if decode.compression_ratio > self.compression_ratio_threshold:
            return True
        if decode.avg_log_prob < self.log_prob_threshold:
            silent = (decode.no_speech_prob is not None
                      and decode.no_speech_prob > self.no_speech_threshold)
            return not silent
        return False


@dataclass(frozen=True)
class DecodeAttempt:
    """One finished decode of a segment at one temperature.

    Attributes:
        tokens: generated text tokens (no prompt, no end token).
        text: their text.
        temperature: 0 for greedy.
        avg_log_prob: summed log-probability per token (end token counted).
        no_speech_prob: P(no-speech) at the start token (None when the vocabulary has none).
        looped: stopped by ``RepetitionStop``.
        truncated: stopped by the token budget before the end token.
        token_log_probs: log-probability of each generated token (after a forced prefix; no
            end token), where the decode kept them (the continuous decoder's rows).
    """

    tokens: tuple[int, ...]
    text: str
    temperature: float
    avg_log_prob: float
    no_speech_prob: float | None
    looped: bool = False
    truncated: bool = False
    token_log_probs: tuple[float, ...] = ()

    @property
    def compression_ratio(self) -> float:
        return compression_ratio(self.text)


def best_attempt(attempts: Sequence[DecodeAttempt], rule: FallbackRule) -> DecodeAttempt:
    """The decode to keep when every temperature failed: among those that did not loop and
    compress normally, the likeliest; else the likeliest of all (faster-whisper's choice)."""
    if not attempts:
        raise ValueError("best_attempt needs at least one attempt")
    sane = [a for a in attempts if not a.looped and not a.truncated
            and a.compression_ratio <= rule.compression_ratio_threshold]
    return max(sane or attempts, key=lambda a: a.avg_log_prob)
