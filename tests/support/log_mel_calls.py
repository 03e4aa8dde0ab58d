"""A count of the causal log-mel's batched calls, for tests of who feeds it how."""

from __future__ import annotations

import numpy as np
import pytest

from oasr.models.whisper_ctc import CausalLogMel


def count_log_mel_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now until the test ends, each ``CausalLogMel.accept_many`` call appends how many
    extractors it was given to the returned list (and then runs as usual)."""
    calls: list[int] = []
    accept_many = CausalLogMel.accept_many.__func__  # type: ignore[attr-defined]

    def counted(cls: type, extractors: list[CausalLogMel],
                samples: list[np.ndarray]) -> list[np.ndarray]:
        calls.append(len(extractors))
        return accept_many(cls, extractors, samples)

    monkeypatch.setattr(CausalLogMel, "accept_many", classmethod(counted))
    return calls
