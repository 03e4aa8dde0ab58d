"""RequestStatus: each allowed transition succeeds, each illegal one raises (STYLE 11)."""

from __future__ import annotations

import itertools

import pytest

from oasr.audio import ChunkGeometry, ChunkWindower, StreamingFbank
from oasr.decoding import Hypothesis
from oasr.engine.live.state import EarlyFinal
from oasr.engine.request import Request, RequestStatus

W, R, F = RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.FINISHED
ALLOWED = {(W, R), (W, F), (R, F)}
ILLEGAL = sorted(set(itertools.product(RequestStatus, repeat=2)) - ALLOWED,
                 key=lambda pair: (pair[0].value, pair[1].value))


def _request_in(status: RequestStatus) -> Request:
    request = Request(stream_id=7, sink=lambda event: None, created_at=0.0,
                      features=StreamingFbank(), windower=ChunkWindower(ChunkGeometry()))
    path = {W: [], R: [R], F: [F]}[status]
    for step in path:
        request.transition(step)
    assert request.status is status
    return request


def test_the_lists_cover_every_pair() -> None:
    assert len(ALLOWED) + len(ILLEGAL) == len(RequestStatus) ** 2 == 9
    assert len(ILLEGAL) == 6  # W->W, R->W, R->R, F->W, F->R, F->F


def test_a_new_request_is_waiting() -> None:
    assert _request_in(W).status is W


@pytest.mark.parametrize(("old", "new"), sorted(ALLOWED, key=lambda p: (p[0].value, p[1].value)),
                         ids=lambda s: s.value)
def test_allowed_transition_succeeds(old: RequestStatus, new: RequestStatus) -> None:
    request = _request_in(old)
    request.transition(new)
    assert request.status is new
    assert request.is_running == (new is R)
    assert request.is_finished == (new is F)


@pytest.mark.parametrize(("old", "new"), ILLEGAL, ids=lambda s: s.value)
def test_illegal_transition_raises(old: RequestStatus, new: RequestStatus) -> None:
    request = _request_in(old)
    with pytest.raises(RuntimeError, match=f"stream 7: illegal transition {old.value} -> {new.value}"):
        request.transition(new)
    assert request.status is old  # nothing changed


def _hyp(tokens: list[int], timestamps: list[int]) -> Hypothesis:
    return Hypothesis(tokens, "", 0.0, timestamps)


def test_an_early_final_holds_while_the_ctc_pass_hears_nothing_after_its_audio() -> None:
    # decoded on tokens (1, 2), words reaching frame 50; no pause heard between chunks
    early = EarlyFinal(job_id=1, tokens=(1, 2), num_frames=50, heard_to=50)
    assert early.still_holds(_hyp([1, 2], [10, 40]))
    assert early.still_holds(_hyp([1, 3], [10, 45]))  # re-ranked inside its audio
    assert not early.still_holds(_hyp([1, 2, 4], [10, 40, 50]))  # a token after: went on
    assert not early.still_holds(None)


def test_a_late_letter_in_the_heard_pause_is_the_last_word_not_a_new_one() -> None:
    # the sound of its words ended at frame 50; the decode was given the quiet audio to frame
    # 70, of which 50-65 counts as quiet (the rest may hold a new word's soft start)
    early = EarlyFinal(job_id=1, tokens=(1, 2), num_frames=50, heard_to=70, quiet_to=65)
    assert early.still_holds(_hyp([1, 2, 3], [10, 40, 56]))  # "-ity" written late
    assert not early.still_holds(_hyp([1, 2, 3], [10, 40, 65]))
    assert not early.still_holds(_hyp([1, 2, 3], [10, 40, 80]))
