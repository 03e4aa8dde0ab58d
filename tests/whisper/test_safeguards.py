"""Whisper's safeguards: compression ratio, repetition stop, token budget, fallback rule."""

from __future__ import annotations

import pytest

from oasr.models.whisper.safeguards import (
    DecodeAttempt,
    FallbackRule,
    RepetitionStop,
    TokenBudget,
    best_attempt,
    compression_ratio,
)


def attempt(text: str = "the cat sat", avg: float = -0.3, ns: float | None = 0.01,
            looped: bool = False, truncated: bool = False, temperature: float = 0.0) -> DecodeAttempt:
    return DecodeAttempt((1, 2, 3), text, temperature, avg, ns, looped, truncated)


def test_compression_ratio_flags_repeated_text() -> None:
    assert compression_ratio("") == 0.0
    assert compression_ratio("He was not an ill-disposed young man.") < 1.2
    assert compression_ratio("I take 0, " + "1, " * 60) > 2.4


def test_repetition_stop_tells_loops_from_speech() -> None:
    rule = RepetitionStop()
    comma, eight, nine = 11, 28, 29
    assert not rule.is_looping([nine, comma] * 3)  # "9, 9, 9": a digit said three times
    assert not rule.is_looping([5, 6, 7, 8] * 2)  # a phrase said twice
    assert rule.is_looping([1, 2, 3] + [eight, comma] * 6)  # "8, 8, 8, 8, 8, 8,"
    assert not rule.is_looping([1, 2, 3] + [eight, comma] * 5)
    assert rule.is_looping([40, 41, 42, 43] * 3)  # a four-token phrase three times
    assert rule.is_looping([7] * 12) and not rule.is_looping([7] * 11)
    assert not rule.is_looping([eight, comma] * 6 + [99])  # the loop must end at the last token
    assert not rule.is_looping([])
    with pytest.raises(ValueError, match="min_repeats >= 2"):
        RepetitionStop(min_repeats=1)


def test_token_budget_scales_with_duration_and_is_capped() -> None:
    budget = TokenBudget(per_second=12.0, base=16)
    assert budget.max_tokens(4 * 16000, ceiling=446) == 16 + 48
    assert budget.max_tokens(0, ceiling=446) == 16
    assert budget.max_tokens(30 * 16000, ceiling=446) == 376
    assert budget.max_tokens(60 * 16000, ceiling=446) == 446
    with pytest.raises(ValueError, match="per_second must be > 0"):
        TokenBudget(per_second=0.0)


def test_fallback_rule_follows_the_reference_thresholds() -> None:
    rule = FallbackRule()
    assert not rule.is_failed(attempt())
    assert rule.is_failed(attempt(looped=True))
    assert rule.is_failed(attempt(truncated=True))
    assert rule.is_failed(attempt(text="1, " * 60))  # compression ratio above 2.4
    assert rule.is_failed(attempt(avg=-1.3))  # unlikely text
    assert not rule.is_failed(attempt(avg=-1.3, ns=0.9))  # ... on silence: no fallback
    assert rule.is_failed(attempt(avg=-1.3, ns=None))
    with pytest.raises(ValueError, match="ascending"):
        FallbackRule(temperatures=(0.4, 0.2))
    with pytest.raises(ValueError, match="best_of must be >= 1"):
        FallbackRule(best_of=0)


def test_best_attempt_prefers_sane_text_then_likelihood() -> None:
    rule = FallbackRule()
    loop = attempt(text="8, " * 50, avg=-0.1, looped=True)
    poor = attempt(text="this is my guess", avg=-1.4, temperature=0.2)
    better = attempt(text="six five seven", avg=-1.1, temperature=0.4)
    assert best_attempt([loop, poor, better], rule) is better
    assert best_attempt([loop], rule) is loop
    with pytest.raises(ValueError, match="at least one"):
        best_attempt([], rule)
