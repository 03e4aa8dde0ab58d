"""LivePolicy's hooks as the loop calls them: what a segment shows first, what its final may
hold, and the decisions it hands back."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import live_stream
from test_second_pass_worker import _answer, _hyp, _QueueingWorker, _voice

from oasr.audio import ChunkGeometry
from oasr.decoding import EndpointDecision
from oasr.engine.events import Final, Partial, StreamEvent
from oasr.engine.families.base import FrameTiming
from oasr.engine.live.agreement import RefinedPartial
from oasr.engine.live.finals import FinalPublisher
from oasr.engine.live.policy import LivePolicy, SegmentEnd, is_sure_start
from oasr.engine.live.segment_cuts import SegmentCuts
from oasr.engine.live.state import SegmentAudio

TIMING = FrameTiming(frame_shift_s=0.02, right_context_samples=0)


def _policy(worker: object = None) -> LivePolicy:
    finals = FinalPublisher(worker, TIMING)  # type: ignore[arg-type]
    return LivePolicy(finals, None, SegmentCuts(None, ChunkGeometry(chunk_size=32)), TIMING, 32)


def _opened(policy: LivePolicy) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    view = live_stream(sink=events.append).view
    policy.open(view)
    return events


@pytest.mark.parametrize(("ctc", "sure"), [
    ("", False), ("a", False), ("it", False), ("i'", False),
    ("was", True), ("it was", True), ("a b", True), ("4", False), ("42", False), ("1984", True),
])
def test_a_segment_starts_showing_words_not_a_first_letters_guess(ctc: str, sure: bool) -> None:
    assert is_sure_start(RefinedPartial("", "", ctc)) is sure
    assert is_sure_start(RefinedPartial("", "It", ctc))  # a refinement's words are shown


def test_the_first_partial_waits_for_words_then_every_change_is_shown() -> None:
    policy = _policy()
    events = _opened(policy)
    view = policy.streams[1].view
    for text, frames in [("a", 32), ("it was", 64), ("it was a", 96)]:
        view.offset = view.num_frames_decoded = frames  # type: ignore[misc]
        end = policy.after_chunk(1, text, None, None, None, False, 1)
        assert end is None
    assert [e.text for e in events if isinstance(e, Partial)] == ["it was", "it was a"]


def test_an_endpoint_comes_back_as_the_loop_s_decision() -> None:
    policy = _policy()
    _opened(policy)
    end = policy.after_chunk(1, "hello", None, None, EndpointDecision("rule2", 20), False, 1)
    assert end == SegmentEnd("rule2", 20)
    # the stream's last chunk: its final comes with its end, not with an endpoint
    assert policy.after_chunk(1, "hello", None, None, EndpointDecision("rule2", 20), True, 1) is None


@pytest.mark.parametrize(("whisper", "final"), [
    (".", ""), ("...", ""), ("Yes.", "Yes."),
    # the mark that closes the previous final's sentence is not this final's
    (". And Mr. John Dashwood.", "And Mr. John Dashwood."), ("...and then", "and then"),
    ("\u201cQuoted.\u201d", "\u201cQuoted.\u201d"),
])
def test_a_final_is_sent_from_its_first_word(whisper: str, final: str) -> None:
    worker = _QueueingWorker()
    policy = _policy(worker)
    events = _opened(policy)
    stream = policy.streams[1]
    stream.audio = SegmentAudio(30 * 16_000)
    stream.audio.append(_voice(1.0))
    stream.view.offset = stream.view.num_frames_decoded = 50  # type: ignore[misc]
    policy.end_segment(1, _hyp([5], 40), "endpoint", 50, 1)
    (job,) = worker.jobs
    assert policy.on_second_pass(_answer(job, whisper, (7,))) is None
    (published,) = [e for e in events if isinstance(e, Final)]
    assert published.text == final and published.source == "whisper"
    assert [w.word for w in published.words] == final.split()
    assert not policy.has_pending(1) and policy.close(1) == 1


def test_audio_is_kept_for_the_second_pass_only_when_it_is_on() -> None:
    off, on = _policy(), _policy(_QueueingWorker())
    for policy in (off, on):
        _opened(policy)
        policy.on_audio([(1, np.ones(1600, dtype=np.float32))], 0.0)
    assert off.streams[1].audio.num_held == 0 and on.streams[1].audio.num_held == 1600
    assert off.streams[1].energy.num_frames == on.streams[1].energy.num_frames == 5


@pytest.mark.parametrize(("parts", "shown"), [
    (RefinedPartial(". And Mr.", "John", "dashwood"), RefinedPartial("And Mr.", "John", "dashwood")),
    (RefinedPartial("", ". And", "mr"), RefinedPartial("", "And", "mr")),
    (RefinedPartial("It was", "a", ""), RefinedPartial("It was", "a", "")),
])
def test_a_partial_is_shown_from_its_first_word(parts: RefinedPartial,
                                                shown: RefinedPartial) -> None:
    assert parts.from_first_word() == shown
    policy = _policy()
    events = _opened(policy)
    policy._emit_partial(policy.streams[1], parts)
    (partial,) = [e for e in events if isinstance(e, Partial)]
    assert partial.text == shown.text
