"""RequestStatus: each allowed transition succeeds, each illegal one raises (STYLE 11)."""

from __future__ import annotations

import itertools

import pytest

from oasr.audio import ChunkGeometry, ChunkWindower, StreamingFbank
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
