"""bench/admission_ramp.py's bookkeeping: each client's audio and references, and what a ramp's
summary counts (the load itself runs against a real server: see the script)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the script is run by path, not installed

import admission_ramp  # noqa: E402


def test_a_client_streams_whole_recordings_with_their_references() -> None:
    pool = admission_ramp.recordings()
    assert len(pool) == 16 and all(text for _, text in pool)
    pcm, reference = admission_ramp.client_audio(3, pool)
    seconds = len(pcm) / 2 / admission_ramp.RATE
    assert admission_ramp.CLIENT_AUDIO_S <= seconds < admission_ramp.CLIENT_AUDIO_S + 15
    assert reference.startswith(pool[15][1])  # client 3 begins at recording 3 * 5 mod 16


def test_the_summary_counts_the_streams_admitted_before_the_first_refusal() -> None:
    clients = [admission_ramp.Client(i, started_at=float(i), admitted=i not in (2, 4),
                                     refused="" if i not in (2, 4) else "busy: full",
                                     partial_delays=[0.1 * (i + 1)], text="a b", reference="a b")
               for i in range(5)]
    summary = admission_ramp.summary(clients)
    assert summary["admitted"] == 3 and summary["refused"] == 2
    assert summary["admitted_before_first_refusal"] == 2 and summary["first_refusal_at_s"] == 2.0
    assert summary["finals_wer"] == 0.0 and summary["partial_delay_max_ms"] == 400
