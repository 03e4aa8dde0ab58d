"""bench/live_text.py's reading of a client's messages: final lag, when the text settled,
the last partial, committed words that changed, and segments against a passage's sentences."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support.bench_scripts import load_bench_script


def load_script() -> Any:
    return load_bench_script("live_text")


def passage(live: Any, reference: str, sentences: list[tuple[float, float]] | None = None
            ) -> Any:
    """Passage "p" (no audio: only its reference and sentence spans are read)."""
    return live.Passage("p", np.zeros(0, np.float32), reference, sentences or [])


def client_log(live: Any) -> Any:
    """A client of passage "p" that sent 0.1 s of audio every 0.1 s from t=100 (the sample at
    s seconds was sent at 100 + s - 0.1)."""
    return live.ClientLog("p", sent=[(100.0 + i * 0.1, 1600 * (i + 1)) for i in range(100)])


def partial(segment: int, text: str, end: float, stable: str = "") -> dict:
    return {"type": "partial", "segment": segment, "text": text, "end": end, "stable": stable,
            "tentative": ""}


def final(segment: int, text: str, end: float, decided_at: float | None = None) -> dict:
    """A final whose segment the server ended with ``decided_at`` of audio (default: 1 s of
    pause after ``end``)."""
    return {"type": "final", "segment": segment, "text": text, "end": end, "start": 0.0,
            "reason": "endpoint", "source": "whisper",
            "decided_at": end + 1.0 if decided_at is None else decided_at}


def test_settled_is_when_the_page_last_came_to_the_final_words() -> None:
    live = load_script()
    log = client_log(live)
    # segment 0's last word ends at 2.0 s of audio, sent at t=101.9; its partials show the
    # final's words at 102.6, leave them at 102.8 and come back to them (case and punctuation
    # aside) at 103.0; the final arrives at 103.5
    log.messages = [
        (101.0, partial(0, "the quick", 1.0)),
        (102.1, partial(0, "the quick brow fox", 2.0)),
        (102.6, partial(0, "The quick brown fox", 2.6, stable="The quick")),
        (102.8, partial(0, "The quick brown fox a", 2.8, stable="The quick")),
        (103.0, partial(0, "the quick brown fox.", 3.0, stable="The quick")),
        (103.5, final(0, "The quick brown fox.", 2.0)),
        # segment 1 (last word at 3.5 s, sent at 103.4): the page never showed the final's
        # words, so its text settled when the final came
        (104.0, partial(1, "jumps over", 4.0)),
        (105.2, final(1, "jumps over it", 3.5)),
    ]
    row = live.analyse([log], [passage(live, "the quick brown fox jumps over it")])
    assert row["num_finals"] == 2
    assert row["final_lag_p50"] == round((1.6 + 1.8) / 2, 2)
    assert row["settled_p50"] == round((1.1 + 1.8) / 2, 2)
    # both segments ended 1 s after their last word (sent at 102.9 and 104.4)
    assert row["after_decision_p50"] == round((0.6 + 0.8) / 2, 2)
    assert row["last_partial_wer"] > 0 and row["final_wer"] == 0.0
    assert row["changed_committed"] == 0


def test_after_end_is_done_minus_the_clients_end() -> None:
    live = load_script()
    ended_early, ended_late = client_log(live), client_log(live)
    # the endpoint ended the first session's segment before its client's end at 103.0; the
    # second's final and done came after its end at 104.0
    ended_early.ended_at, ended_late.ended_at = 103.0, 104.0
    ended_early.messages = [(102.5, final(0, "The quick brown fox.", 1.5)),
                            (103.1, {"type": "done"})]
    ended_late.messages = [(105.4, final(0, "The quick brown fox.", 3.0, decided_at=3.9)),
                           (105.5, {"type": "done"})]
    row = live.analyse([ended_early, ended_late], [passage(live, "the quick brown fox")])
    assert row["after_end_p50"] == round((0.1 + 1.5) / 2, 2)
    assert row["after_end_p95"] == round(0.1 + 0.95 * 1.4, 2)
    # a session that never sent its end (a failed client) has no after_end
    assert math.isnan(live.analyse([client_log(live)], [passage(live, "x")])["after_end_p50"])


def test_a_committed_word_that_changes_is_counted() -> None:
    live = load_script()
    log = client_log(live)
    log.messages = [
        (101.0, partial(0, "The quick brown", 1.0, stable="The quick")),
        (101.5, partial(0, "The quack brown", 1.5, stable="The quack")),
        (102.5, final(0, "The quick brown.", 1.5)),
    ]
    row = live.analyse([log], [passage(live, "the quick brown")])
    assert row["changed_committed"] == 2  # quick -> quack (partial), quack -> quick (final)
    assert row["settled_p50"] == row["final_lag_p50"] == round(102.5 - 101.4, 2)


def test_stable_words_are_counted_at_each_whisper_final() -> None:
    live = load_script()
    log = client_log(live)
    ctc_final = {**final(2, "over it", 4.0), "source": "ctc"}
    log.messages = [
        (101.0, partial(0, "The quick", 1.0, stable="The")),
        (101.5, partial(0, "The quick brown", 1.5, stable="The quick")),
        (102.5, final(0, "The quick brown.", 1.5)),
        # a guess both refinements made is stable, forced into the final, and not a word of
        # the passage
        (103.0, partial(1, "Fax jumps", 2.5, stable="Fax jumps,")),
        (103.5, final(1, "Fax jumps.", 2.5)),
        # a segment whose final kept its CTC text forces nothing
        (104.0, partial(2, "over it", 3.5, stable="over")),
        (105.0, ctc_final),
    ]
    row = live.analyse([log], [passage(live, "the quick brown fox jumps over it")])
    assert row["stable_words"] == 4
    assert row["stable_not_in_reference"] == 1


def test_segments_are_counted_against_the_passages_sentences() -> None:
    live = load_script()
    log = client_log(live)
    # sentences at 0.5-4.0 s and 5.0-8.0 s: a final ending at 2.0 s cuts the first (at a
    # breath), one ending at 3.9 s ends it (within 0.3 s of its end), "ups." is one word
    log.messages = [
        (103.0, final(0, "The quick brown fox", 2.0)),
        (104.5, final(1, "jumps over it.", 3.9)),
        (106.0, final(2, "Ups.", 5.6)),
        (109.0, final(3, "and then the dog slept.", 8.0)),
    ]
    reference = "the quick brown fox jumps over it ups and then the dog slept"
    row = live.analyse([log], [passage(live, reference, [(0.5, 4.0), (5.0, 8.0)])])
    assert row["one_word_finals"] == 1
    assert row["mid_sentence_cuts"] == 2  # at 2.0 s and at 5.6 s
    assert [f["end"] for f in row["finals"][0]["finals"]] == [2.0, 3.9, 5.6, 8.0]
    # the wait after speech counts the two finals that close a sentence, from its end: 3.9 s
    # closes 0.5-4.0 (sample 4.0 sent at 103.9, final at 104.5), 8.0 s closes 5.0-8.0 (sent at
    # 107.9, final at 109.0); the cuts at 2.0 and 5.6 s close none
    assert row["after_speech_p50"] == round((0.6 + 1.1) / 2, 2)
    assert row["after_speech_p95"] == pytest.approx(0.6 + 0.95 * 0.5, abs=0.011)
    # and each final says its own, to find the slow ones
    assert [f["after_speech"] for f in row["finals"][0]["finals"]] == [None, 0.6, None, 1.1]
    # passages without sentence spans report none
    unknown = live.analyse([log], [passage(live, reference)])
    assert unknown["mid_sentence_cuts"] is None and unknown["after_speech_p50"] is None


def test_the_devsets_passage_knows_where_each_sentence_was_spoken() -> None:
    # the devset's read recordings joined (0.5 s lead, 0.9 s after each clip): a sentence's
    # span runs from its first clip's first word to its last clip's last, room tone left out
    live = load_script()
    devset = live.passages(live.DEVSET_DIR)[0]
    assert devset.name == "devset_read" and len(devset.sentences) == len(live.READ) == 4
    clips = [[live._load(live.DEVSET_DIR / n) for n in names] for names in live.READ]
    t = 0.5
    for (start, end), recorded in zip(devset.sentences, clips, strict=True):
        length = sum(len(c) for c in recorded) / live.SR + 0.9 * len(recorded)
        last_clip_end = t + length - 0.9
        assert t < start < t + 0.5  # its first word, after the recording's lead-in
        # its last word: 0.2-0.5 s before the recording ends for the LibriVox reader (room
        # tone after it), with the applause at JFK's end
        assert last_clip_end - 0.5 < end <= last_clip_end
        t += length
    assert len(devset.audio) / live.SR == pytest.approx(t, abs=1e-3)


def test_the_same_sessions_passages_alone_tell_the_load_from_the_material() -> None:
    """``final_errors`` counts each passage's sessions, word errors and words; ``wer_alone``
    weighs a one-client run's errors per session of each passage by how many sessions of it
    the loaded run had, so a load that reads harder passages more often is not blamed."""
    live = load_script()
    logs = []
    for text in ("the quick brown fox", "the quick brown box"):  # 0 and 1 errors
        log = client_log(live)
        log.messages = [(103.0, final(0, text, 2.0))]
        logs.append(log)
    row = live.analyse(logs, [passage(live, "the quick brown fox")])
    assert row["final_errors"] == {"p": {"sessions": 2, "word_errors": 1, "words": 8}}
    alone = {"p": {"sessions": 1, "word_errors": 1, "words": 4},
             "q": {"sessions": 2, "word_errors": 0, "words": 10}}
    assert live.wer_alone(row["final_errors"], alone) == 25.0  # 2 x 1 error over 8 words
    loaded = {"p": {"sessions": 3, "word_errors": 3, "words": 12},
              "q": {"sessions": 1, "word_errors": 2, "words": 5}}
    assert live.wer_alone(loaded, alone) == round(100 * 3 / 17, 1)  # q: 0 errors alone
    assert live.wer_alone({"r": {"sessions": 1, "word_errors": 0, "words": 3}}, alone) is None


def test_the_cpu_meter_reads_the_servers_process_and_its_steps(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Steps a second and audio a step from `/api/stats` at both ends of a level; the CPU of
    the process started with the server's port (here this test's own)."""
    import os
    import time

    live = load_script()
    stats = {"step": {"num_steps": 10}, "total_audio_s": 6.4}  # /api/stats's shape

    class Reply:
        def json(self) -> dict:
            return stats

    monkeypatch.setattr(live.httpx, "get", lambda *a, **k: Reply())
    monkeypatch.setattr(live, "pid_with_args", lambda *args: os.getpid()
                        if args == ("--port", "8123") else None)
    meter = live.CpuMeter("127.0.0.1:8123")
    end = time.process_time() + 0.2
    while time.process_time() < end:  # some CPU for both readings to see
        pass
    cpu = meter.read({"step": {"num_steps": 20}, "total_audio_s": 19.2})
    assert cpu["audio_s_per_step"] == 1.28 and cpu["engine_steps_per_s"] > 0
    assert cpu["server"] > 0 and cpu["load_generator"] > 0
