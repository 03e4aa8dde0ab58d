"""Refined partials: LocalAgreement's committed prefix, the three parts of a partial, CTC word
times, and the refiner's bookkeeping of results."""

from __future__ import annotations

import argparse
import itertools
import math
import types
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from oasr.decoding import Hypothesis
from oasr.decoding.words import word_probabilities
from oasr.engine.families.base import FrameTiming
from oasr.engine.live.agreement import (
    LocalAgreement,
    RefinedPartial,
    RefineState,
    compose,
    first_repeat,
    word_start_frames,
)
from oasr.engine.live.finals import FinalPublisher
from oasr.engine.live.refine import RefineConfig, Refiner
from oasr.engine.live.state import EarlyFinal
from oasr.engine.options import add_engine_arguments, engine_config_from_args
from oasr.engine.second_pass.worker import RefineDone, RefineJob, SecondPassDone
from oasr.text.tokenizer import CharTokenizer

UNITS = ["<blank>", "<unk>", "'", *"abcdefghijklmnopqrstuvwxyz", "\u2581", "<sos/eos>"]
SPACE = UNITS.index("\u2581")


def _words(text: str) -> list[str]:
    return text.split()


def ids(text: str) -> list[int]:
    return [SPACE if c == " " else UNITS.index(c) for c in text]


def test_words_are_committed_once_two_refinements_agree() -> None:
    agreement = LocalAgreement()
    agreement.update(["And", "Mr.", "John", "Dash."])
    assert agreement.committed == [] and agreement.tentative == ["And", "Mr.", "John", "Dash."]
    agreement.update(["And", "Mr.", "John", "Dashwood", "had", "then."])
    assert agreement.committed == ["And", "Mr.", "John"]
    assert agreement.tentative == ["Dashwood", "had", "then."]
    agreement.update(["And", "Mr.", "John", "Dashwood", "had", "then", "leisure"])
    # "then." and "then" agree (compared as scored)
    assert agreement.committed == ["And", "Mr.", "John", "Dashwood", "had", "then"]


def test_committed_words_never_change() -> None:
    agreement = LocalAgreement()
    agreement.update(["the", "cat", "sat"])
    agreement.update(["the", "cat", "sat", "on"])
    committed = list(agreement.committed)
    agreement.update(["a", "hat", "sat", "on", "the"])  # not built on the committed words
    assert agreement.committed == committed
    # same words, other spelling; agreement is with the last refinement built on the prefix
    agreement.update(["The", "cat", "sat", "on", "the", "mat"])
    assert agreement.committed[:3] == committed and agreement.committed[3:] == ["on"]
    agreement.reset()
    assert agreement.committed == [] and agreement.latest == []


def test_a_phrase_copied_back_to_back_is_never_committed() -> None:
    # greedy refinements of 11-14 s of "..., it was the epoch of belief, it was the epoch of
    # incredulity" (a TTS reading) copy the phrase before; two of them agree on the copy
    agreement = LocalAgreement()
    copied = ["of", "foolishness.", "It", "was", "the", "upper", "conceit.", "It", "was", "the", "upper", "conceit."]
    agreement.update(copied)
    agreement.update(copied)
    assert agreement.committed == ["of", "foolishness."]
    # a later refinement without the copy agrees with it only on what came before it
    agreement.update(["of", "foolishness.", "It", "was", "the", "upper", "complete.", "It", "was", "the", "upper"])
    assert agreement.committed == ["of", "foolishness."]
    heard = ["of", "foolishness.", "It", "was", "the", "epoch", "of", "belief.", "It", "was", "the", "epoch", "of"]
    agreement.update(heard)
    agreement.update([*heard, "incredulity."])
    # phrases that only start alike are no copy
    assert agreement.committed == heard


def test_three_agreeing_refinements_and_held_words() -> None:
    agreement = LocalAgreement(agreeing=3)
    agreement.update(_words("It was the best on"))
    agreement.update(_words("It was the best on times"))
    assert agreement.committed == []  # two refinements are not three
    agreement.update(_words("It was the best of times it"))
    assert agreement.committed == ["It", "was", "the", "best"]
    # the oldest agreeing refinement's last two words wait for the next one
    held = LocalAgreement(hold_words=2)
    held.update(_words("My dear Mr. Bennet"))
    held.update(_words("My dear Mr. Bennet said his"))
    assert held.committed == ["My", "dear"]
    held.update(_words("My dear Mr. Bennet said his lady"))
    assert held.committed == ["My", "dear", "Mr.", "Bennet"]
    with pytest.raises(ValueError, match="agreeing >= 2"):
        LocalAgreement(agreeing=1)
    with pytest.raises(ValueError, match="agreeing >= 2"):
        RefineConfig(agreeing=1)


def test_a_word_a_refinement_was_unsure_of_is_not_committed() -> None:
    agreement = LocalAgreement()
    words = _words("He was not an old-sposed young man")
    unsure = [True, True, True, True, False, True, True]  # "old-sposed": a guess
    agreement.update(words, sure=unsure)
    agreement.update([*words, "unless"])
    assert agreement.committed == ["He", "was", "not", "an"]
    agreement.update(_words("He was not an ill-disposed young man unless"))
    # the newest is sure of "ill-disposed", the one before wrote "old-sposed": no agreement
    assert agreement.committed == ["He", "was", "not", "an"]


def test_word_probabilities_are_each_words_least_likely_generated_token() -> None:
    # tokens 0-1 forced; words end after tokens 2, 3 and 6 (the first spans forced and
    # generated tokens: only its generated one counts)
    probs = word_probabilities([3, 4, 7], 2, [math.log(0.9), math.log(0.2), math.log(0.8),
                                              math.log(0.5), math.log(0.95)])
    assert probs == pytest.approx((0.9, 0.2, 0.5))
    assert word_probabilities([2, 5], 2, [math.log(0.3)] * 3) == pytest.approx((1.0, 0.3))
    assert word_probabilities([1, 2], 0, []) == (1.0, 1.0)  # no probabilities kept


@pytest.mark.parametrize(("floor", "committed"), [
    (0.5, ["I", "account"]),  # "it" was 0.3 likely in the older refinement
    (0.0, ["I", "account", "it", "high", "time"]),  # agreement alone
    (None, ["I", "account"]),  # the default, 0.8: "it" as at 0.5
    (0.95, []),  # "I" was 0.9 likely in both
])
def test_a_refinement_commits_only_the_words_its_decoder_was_sure_of(
        floor: float | None, committed: list[str]) -> None:
    timing = FrameTiming(frame_shift_s=0.04, right_context_samples=0)
    config = RefineConfig() if floor is None else RefineConfig(min_word_prob=floor)
    refiner = Refiner(config, _Worker(), timing, None, itertools.count(1).__next__)
    request = _stream(1, frames=200, requested=100, last_token=100)
    state = request.refine
    for job_id, (words, probs, frames) in enumerate([
            ("I account it high time", (0.9, 0.9, 0.3, 0.9, 0.9), 100),
            ("I account it high time to", (0.9, 0.9, 0.9, 0.9, 0.9, 0.6), 150)]):
        ends = tuple(range(1, len(probs) + 1))
        state.in_flight = job_id
        assert refiner.apply(request, RefineDone(job_id, 1, 0, words, ends, ends, False, frames,
                                                 probs))
    assert state.agreement.committed == committed
    assert state.prefix_tokens == tuple(range(1, len(committed) + 1))


def _refining() -> tuple[Refiner, Any]:
    """A refiner with the default config (40 ms frames) and a stream refined up to frame 100."""
    timing = FrameTiming(frame_shift_s=0.04, right_context_samples=0)
    refiner = Refiner(RefineConfig(), _Worker(), timing, None, itertools.count(1).__next__)
    return refiner, _stream(1, frames=300, requested=100, last_token=100)


def test_refinements_decoded_alone_show_their_words_but_do_not_commit_them() -> None:
    # decoded again without the context (after which Whisper heard nothing): alone, Whisper
    # may leave out a sentence's first "And", which committed words would force on the final
    refiner, request = _refining()
    state = request.refine
    for job_id, (words, frames, alone) in enumerate([
            ("Mr. John Dashwood had", 100, True),
            ("Mr. John Dashwood had then leisure", 150, True),
            ("Mr. John Dashwood had then leisure to consider", 200, False)]):
        state.in_flight = job_id
        ends = tuple(range(1, len(words.split()) + 1))
        assert refiner.apply(request, RefineDone(job_id, 1, 0, words, ends, ends, False, frames,
                                                 alone=alone))
        if alone:  # shown, all of it tentative
            assert state.agreement.committed == []
            assert compose(state, "", []).tentative == words
    # a decode with the context that agrees with them is the second opinion: they commit
    assert " ".join(state.agreement.committed) == "Mr. John Dashwood had then leisure"


def test_the_forced_tokens_spell_the_committed_words_as_they_were_shown() -> None:
    # a refinement that started before a commit (so the committed words were not forced into
    # it) may spell them otherwise ("Call" where "call" was committed): it agrees with them as
    # compared and commits the word it agrees on after them, but the tokens forced into the
    # final keep the committed words' own tokens (a final beginning "Call" changed a shown word)
    refiner, request = _refining()
    state = request.refine
    for job_id, (words, tokens, frames) in enumerate([
            ("call me a ship", (1, 2, 3, 4), 100),
            ("call me a ship some", (1, 2, 3, 4, 5), 150),  # commits "call me a ship"
            ("Call me a ship, some years", (11, 2, 3, 12, 5, 6), 200)]):  # commits "some"
        state.in_flight = job_id
        ends = tuple(range(1, len(tokens) + 1))
        assert refiner.apply(request, RefineDone(job_id, 1, 0, words, tokens, ends, False,
                                                 frames))
    assert state.agreement.committed == ["call", "me", "a", "ship", "some"]
    assert state.prefix_tokens == (1, 2, 3, 4, 5)
    # an early final decode spelled so is not the final (its answer does not begin with them)
    early = SecondPassDone(9, 1, "Call me a ship, some years ago.", 0.5, "whisper",
                           tokens=(11, 2, 3, 12, 5, 6, 7), word_ends=(1, 2, 3, 4, 5, 6, 7))
    assert refiner.apply_early(request, early, num_frames=250)
    assert state.prefix_tokens[:5] == (1, 2, 3, 4, 5)


def test_the_newest_decodes_words_after_the_committed_ones_are_the_next_decodes_draft() -> None:
    # a greedy decode takes them where each is its own choice (RefineJob.draft, and a
    # busy server's greedy finals: SecondPassJob.draft)
    timing = FrameTiming(frame_shift_s=0.04, right_context_samples=0)
    finals = FinalPublisher(None, timing)
    refiner = Refiner(RefineConfig(), _Worker(), timing, None, finals.next_job_id)
    request = _stream(1, frames=300, requested=100, last_token=100)
    state = request.refine
    for job_id, (words, tokens, frames) in enumerate([
            ("call me a ship", (1, 2, 3, 4), 100),  # nothing committed: all of it a draft
            ("call me a ship some", (1, 2, 3, 4, 5), 150),  # commits "call me a ship"
            ("call me a ship some years ago", (1, 2, 3, 4, 5, 6, 7), 200)]):
        state.in_flight = job_id
        ends = tuple(range(1, len(tokens) + 1))
        assert refiner.apply(request, RefineDone(job_id, 1, 0, words, tokens, ends, False,
                                                 frames))
        if job_id == 0:
            assert state.draft_tokens == (1, 2, 3, 4)
    assert state.prefix_tokens == (1, 2, 3, 4, 5) and state.draft_tokens == (6, 7)
    worker = refiner.worker
    assert refiner._submit(request, 250, now=1.0)
    assert (worker.jobs[-1].prefix, worker.jobs[-1].draft) == ((1, 2, 3, 4, 5), (6, 7))
    job = finals._job(request, Hypothesis([9], "9", 0.0, [90]), np.zeros(1600, np.float32), 1)
    assert (job.prefix, job.draft) == ((1, 2, 3, 4, 5), (6, 7))
    state.reset()  # the segment ended: no draft for the next one
    assert state.draft_tokens == ()


@pytest.mark.parametrize(("text", "start"), [
    ("I had had enough", 4),  # one word twice is speech
    ("no no no more", 0),  # ... three times is a repeat
    ("thank you thank you all", 0),
    ("so it was the age of wisdom it was the age of folly", 13),  # none
    ("well yes it is yes it is", 1),
])
def test_first_repeat_finds_a_phrase_said_twice_in_a_row(text: str, start: int) -> None:
    assert first_repeat(text.split()) == start


def test_a_repeat_inside_the_committed_words_is_not_looked_at_again() -> None:
    assert first_repeat(["a", "b", "a", "b", "c"], after=4) == 5
    assert first_repeat(["a", "b", "a", "b", "c"], after=3) == 0  # it reaches past them

def test_word_start_frames_of_character_units() -> None:
    tokens = ids("he was not")
    frames = list(range(0, 2 * len(tokens), 2))
    assert word_start_frames(CharTokenizer(UNITS), tokens, frames) == [0, 6, 14]
    bpe_units = ["<blank>", "\u2581he", "\u2581wa", "s", "\u2581not"]
    assert word_start_frames(CharTokenizer(bpe_units), [1, 2, 3, 4], [3, 5, 6, 9]) == [3, 5, 9]


def test_a_partial_is_stable_then_tentative_then_the_ctc_words_after_the_refined_audio() -> None:
    assert compose(None, "he was not", [0, 6, 14]) == RefinedPartial("", "", "he was not")
    state = RefineState()
    state.agreement.update(["He", "was", "not", "an"])
    state.agreement.update(["He", "was", "not", "an", "ill"])
    state.refined_frames = 30
    parts = compose(state, "he was not an il disposd yung", [0, 6, 14, 20, 26, 31, 40])
    assert parts == RefinedPartial("He was not an", "ill", "disposd yung")
    assert parts.text == "He was not an ill disposd yung"
    # the CTC words cannot be placed (word counts disagree): no CTC tail rather than a wrong one
    assert compose(state, "he was", [0]).ctc == ""
    # a word whose first letter came just after the refined audio is Whisper's last word
    # ("ill"), not a new one: with a lag of 2 frames it is not shown twice
    starts = [0, 6, 14, 20, 31, 40, 44]
    assert compose(state, "he was not an il disposd yung", starts).ctc == "il disposd yung"
    assert compose(state, "he was not an il disposd yung", starts,
                   lag_frames=2) == RefinedPartial("He was not an", "ill", "disposd yung")


def test_refine_config_is_validated() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        RefineConfig(interval_s=0.0)
    with pytest.raises(ValueError, match="max_in_flight must be >= 1"):
        RefineConfig(max_in_flight=0)
    with pytest.raises(ValueError, match=r"engine_budget must be in \(0, 1\]"):
        RefineConfig(engine_budget=1.5)


class _Worker:
    """The refiner's view of the second pass: idle, records what it is asked to refine."""

    backlog = 0
    busy_seconds = 0.0

    def __init__(self) -> None:
        self.jobs: list[RefineJob] = []

    def try_submit_refine(self, job: RefineJob, max_in_flight: int) -> bool:
        self.jobs.append(job)
        return True


class _Audio:
    def slice(self, start: int, end: int) -> np.ndarray:
        return np.zeros(end - start, dtype=np.float32)


def _stream(stream_id: int, frames: int, requested: int, last_token: int) -> Any:
    state = RefineState(requested_frames=requested, last_token_frame=last_token,
                        refined_at=float(stream_id))
    return types.SimpleNamespace(
        stream_id=stream_id, segment=0, is_running=True, refine=state, last_partial="words",
        num_frames_decoded=frames, segment_start_frame=0, segment_frames=frames,
        audio=_Audio(), early=None, is_paced=lambda now: True, prompt="",
        hotword_phrases=())


def test_a_stream_at_a_pause_is_refined_first_and_before_its_interval() -> None:
    # 40 ms frames: refined up to frame 50; the newest CTC word ended at frame 60
    timing = FrameTiming(frame_shift_s=0.04, right_context_samples=0)
    worker = _Worker()
    refiner = Refiner(RefineConfig(interval_s=1.0, pause_s=0.3, max_in_flight=1), worker,
                      timing, None, itertools.count(1).__next__)
    streams = {
        1: _stream(1, frames=90, requested=50, last_token=90),  # talking: due by interval
        2: _stream(2, frames=68, requested=50, last_token=60),  # 0.32 s of pause, unseen
        3: _stream(3, frames=68, requested=62, last_token=60),  # a pause already refined
        4: _stream(4, frames=64, requested=50, last_token=60),  # 0.16 s: not a pause yet
    }
    refiner.schedule(list(streams.values()), now=100.0, engine_busy_s=0.0)
    assert [job.stream_id for job in worker.jobs] == [2, 1]  # the pause first; 3, 4 not due
    assert worker.jobs[0].num_frames == 68
    assert [job.at_pause for job in worker.jobs] == [True, False]


def test_a_busy_second_pass_still_refines_a_stream_at_a_pause() -> None:
    timing = FrameTiming(frame_shift_s=0.04, right_context_samples=0)
    worker = _Worker()
    worker.backlog = 2  # finals wait: background refinements would only add to them
    refiner = Refiner(RefineConfig(interval_s=1.0, pause_s=0.3), worker, timing, None,
                      itertools.count(1).__next__)
    streams = {1: _stream(1, frames=90, requested=50, last_token=90),
               2: _stream(2, frames=68, requested=50, last_token=60)}
    refiner.schedule(list(streams.values()), now=100.0, engine_busy_s=0.0)
    assert [(job.stream_id, job.at_pause) for job in worker.jobs] == [(2, True)]


def test_a_stream_whose_early_final_decode_is_out_is_not_refined_beside_it() -> None:
    # the early decode (beam search on the segment so far, started at the same pause) refines
    # the partial when it answers; a refinement beside it would only slow it down
    timing = FrameTiming(frame_shift_s=0.04, right_context_samples=0)
    worker = _Worker()
    refiner = Refiner(RefineConfig(interval_s=1.0, pause_s=0.3), worker, timing, None,
                      itertools.count(1).__next__)
    streams = {1: _stream(1, frames=90, requested=50, last_token=70),  # at a pause
               2: _stream(2, frames=90, requested=50, last_token=70)}
    streams[1].early = EarlyFinal(job_id=5, tokens=(1, 2))
    refiner.schedule(list(streams.values()), now=100.0, engine_busy_s=0.0)
    assert [(job.stream_id, job.at_pause) for job in worker.jobs] == [(2, True)]


def test_an_early_final_decode_refines_the_partial_and_a_shorter_refinement_is_stale() -> None:
    timing = FrameTiming(frame_shift_s=0.04, right_context_samples=0)
    refiner = Refiner(RefineConfig(), _Worker(), timing, None, itertools.count(1).__next__)
    request = _stream(1, frames=80, requested=50, last_token=70)
    state = request.refine
    state.agreement.update(["He", "was"])
    state.agreement.update(["He", "was", "not"])  # committed: He was
    state.refined_frames, state.in_flight = 50, 7  # a refinement of 50 frames in flight
    # the early decode at the pause: beam search on all 80 frames, the committed words forced
    early = SecondPassDone(9, 1, "He was not an ill-disposed man.", 0.5, "whisper",
                           tokens=(1, 2, 3, 4, 5, 6, 7), word_ends=(1, 2, 3, 4, 6, 7))
    assert refiner.apply_early(request, early, num_frames=80)
    request.last_partial, request.ctc_starts = "he was not an il disposd man", [0, 6, 14, 20, 26,
                                                                            31, 40]
    assert refiner.parts(request) == RefinedPartial("He was not", "an ill-disposed man.", "")
    # the refinement of 50 frames answers afterwards: older than what the partial shows
    late = RefineDone(7, 1, 0, "He was not and", (1, 2, 3, 8), (1, 2, 3, 4), False, 50)
    assert not refiner.apply(request, late)
    assert state.refined_frames == 80 and state.agreement.tentative[0] == "an"
    # a decode that does not begin with the committed words is not taken
    assert not refiner.apply_early(request, replace(early, text="She was never"), num_frames=90)
    assert state.refined_frames == 80


def test_two_decodes_of_nearly_the_same_audio_commit_nothing() -> None:
    # 20 ms frames; agree_gap_s 0.5 s = 25 frames. A refinement and the early final decode at
    # the same pause (8 frames apart) agree on "asked not": no second opinion, nothing
    # committed; the next refinement, 1 s later, commits what it agrees on with the newest
    timing = FrameTiming(frame_shift_s=0.02, right_context_samples=0)
    refiner = Refiner(RefineConfig(), _Worker(), timing, None, itertools.count(1).__next__)
    request = _stream(1, frames=240, requested=224, last_token=220)
    state = request.refine
    state.in_flight = 3
    words = "And so my fellow Americans asked not"
    tokens = tuple(range(1, 8))
    assert refiner.apply(request, RefineDone(3, 1, 0, words, tokens, tokens, False, 224))
    early = SecondPassDone(9, 1, words + ".", 0.5, "whisper", tokens=tokens, word_ends=tokens)
    assert refiner.apply_early(request, early, num_frames=232)
    assert state.agreement.committed == [] and state.prefix_tokens == ()
    assert state.agreement.latest[-1] == "not."  # shown, tentative
    state.in_flight = 4
    later = "And so my fellow Americans. Ask not what"
    assert refiner.apply(request, RefineDone(4, 1, 0, later, tuple(range(1, 9)),
                                             tuple(range(1, 9)), False, 282))
    assert state.agreement.committed == ["And", "so", "my", "fellow", "Americans."]
    with pytest.raises(ValueError, match="agree_gap_s must be >= 0"):
        RefineConfig(agree_gap_s=-0.1)


def test_a_refinement_carries_the_previous_segments_final() -> None:
    # the previous segment's text is out: the refinement decodes its audio first and forces
    # its text (the worker turns it into tokens), as the segment's final will
    timing = FrameTiming(frame_shift_s=0.04, right_context_samples=0)
    worker = _Worker()
    before = np.ones(640 * 5, dtype=np.float32)
    asked: list[int] = []

    def context_of(request: Any, num_streams: int) -> tuple[str, np.ndarray]:
        asked.append(num_streams)
        return ("Unless to be rather selfish.", before) if request.stream_id == 1 else (
            "", before[:0])

    refiner = Refiner(RefineConfig(interval_s=1.0), worker, timing, None,
                      itertools.count(1).__next__, context_of)
    streams = {1: _stream(1, frames=90, requested=50, last_token=90),
               2: _stream(2, frames=90, requested=50, last_token=90)}
    refiner.schedule(list(streams.values()), now=100.0, engine_busy_s=0.0)
    first, second = sorted(worker.jobs, key=lambda job: job.stream_id)
    assert first.context == "Unless to be rather selfish." and first.context_samples == len(before)
    assert len(first.audio) == len(before) + 90 * 640 and first.num_frames == 90
    assert second.context == "" and second.context_samples == 0
    assert len(second.audio) == 90 * 640 and asked == [2, 2]


def test_commit_rule_flags_reach_the_refine_config() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    default = engine_config_from_args(parser.parse_args(["--lm", "none"]))
    assert default.refine == RefineConfig()  # CLI = library
    assert (default.refine.agreeing, default.refine.min_word_prob) == (2, 0.8)
    assert default.refine.hold_words == 1
    strict = engine_config_from_args(parser.parse_args(
        ["--lm", "none", "--refine-agreeing", "3", "--refine-min-word-prob", "0.5",
         "--refine-hold-words", "1", "--refine-max-streams", "32"]))
    assert strict.refine is not None
    assert (strict.refine.agreeing, strict.refine.min_word_prob) == (3, 0.5)
    assert (strict.refine.hold_words, strict.refine.max_streams) == (1, 32)
    off = engine_config_from_args(parser.parse_args(["--lm", "none", "--refine-interval", "0"]))
    assert off.refine is None
    with pytest.raises(ValueError, match="agreeing >= 2"):
        engine_config_from_args(parser.parse_args(["--lm", "none", "--refine-agreeing", "1"]))
    with pytest.raises(ValueError, match="hold_words >= 0"):
        engine_config_from_args(parser.parse_args(["--lm", "none", "--refine-hold-words", "-1"]))
    with pytest.raises(ValueError, match="max_streams must be >= 1"):
        engine_config_from_args(parser.parse_args(["--lm", "none", "--refine-max-streams", "0"]))
