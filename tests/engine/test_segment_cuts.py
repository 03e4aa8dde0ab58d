"""Where a cut falls (`SegmentCuts.cut_frame`): a length cut at the quietest frame of the
window before the limit, never before the audio of committed refined words; a silence rule's
trailing pause in the middle of its quiet audio."""

from __future__ import annotations

import numpy as np
from engine_helpers import live_stream

from oasr.audio import ChunkGeometry
from oasr.decoding import (
    EndpointConfig,
    EndpointDecision,
    Endpointer,
    EndpointRule,
    Hypothesis,
)
from oasr.decoding.decoder import FrameStats, StreamStep
from oasr.engine.live.agreement import RefineState
from oasr.engine.live.quiet_tail import QuietTail
from oasr.engine.live.segment_cuts import SegmentCuts
from oasr.engine.live.state import LiveStream

SAMPLES_PER_FRAME = 320  # `LiveStream.energy`'s frames


def _request(start: int, quiet: range, frames: int) -> LiveStream:
    """A stream whose segment began at absolute frame ``start``: speech-loud frames, but for
    a quiet breath over the absolute frames ``quiet``."""
    request = live_stream()
    rng = np.random.default_rng(0)
    audio = 0.3 * rng.standard_normal(frames * SAMPLES_PER_FRAME).astype(np.float32)
    for frame in quiet:
        audio[frame * SAMPLES_PER_FRAME:(frame + 1) * SAMPLES_PER_FRAME] *= 1e-3
    request.energy.append(audio)
    request.view.segment_start_frame = start
    return request


def test_a_length_cut_falls_in_the_breath_but_not_before_committed_words() -> None:
    endpointer = Endpointer(EndpointConfig.wenet_quiet_cut())  # 20 s, a 3 s (75 frame) window
    cuts = SegmentCuts(endpointer, ChunkGeometry(chunk_size=16, subsampling=4))
    start, limit = 100, 512  # the chunk that passed 20 s ends 512 frames into the segment
    breath = range(start + 466, start + 475)  # ~40 frames before the chunk's end
    request = _request(start, breath, start + limit)
    decision = EndpointDecision("rule3", limit, is_length_cut=True)
    in_breath = cuts.cut_frame(request, decision)
    assert breath.start - start < in_breath <= breath.stop - start

    # refinements saw audio past the breath and committed words from it: no cut before them
    request.refine = RefineState()
    request.refine.refined_frames = breath.stop - start + 20
    request.refine.agreement.update(["a", "b"])
    request.refine.agreement.update(["a", "b", "c"])  # agrees with the first on "a b"
    assert request.refine.agreement.committed == ["a", "b"]
    cut = cuts.cut_frame(request, decision)
    assert request.refine.refined_frames <= cut <= limit
    # a refinement without committed words promises nothing: the breath again
    request.refine = RefineState(refined_frames=limit)
    assert cuts.cut_frame(request, decision) == in_breath
    # committed words up to the chunk's end: the segment ends there
    request.refine = RefineState(refined_frames=limit)
    request.refine.agreement.update(["a", "b"])
    request.refine.agreement.update(["a", "b"])
    assert cuts.cut_frame(request, decision) == limit


def test_a_cut_in_a_pause_keeps_the_committed_words_a_refinement_heard_there() -> None:
    """A sentence-pause cut falls in the middle of the pause; the refinement made at that
    pause heard past it, but only silence: its committed words are all before the cut."""
    request = _request(0, range(0), 200)
    words = [8, 9, 10, 11, 40, 41, 42]  # CTC tokens' frames: speech to 42, a pause, then 90
    request.last_step = StreamStep(Hypothesis(list(range(len(words))), "", 0.0, words),
                                   FrameStats(100, 0, True))
    assert SegmentCuts.refined_before(request, 60)  # nothing refined: nothing to keep
    request.refine = RefineState(refined_frames=70)
    assert SegmentCuts.refined_before(request, 60)  # nothing committed, 60-69 silent
    request.refine.agreement.update(["a", "b"])
    request.refine.agreement.update(["a", "b", "c"])
    assert SegmentCuts.refined_before(request, 60)  # the refined frames 60-69 are silent
    assert not SegmentCuts.refined_before(request, 41)  # a word after the cut was heard
    request.refine.refined_frames = 100
    request.last_step = StreamStep(Hypothesis([1, 2], "", 0.0, [8, 90]),
                                   FrameStats(100, 0, True))
    assert not SegmentCuts.refined_before(request, 60)  # ... the word at frame 90
    request.last_step = None
    assert not SegmentCuts.refined_before(request, 60)  # no CTC words to tell


def test_a_cut_before_a_word_the_refinement_heard_drops_its_prefix_and_draft() -> None:
    # the final of a segment cut there is decoded free: the committed words may lie after
    # the cut, and so may the tentative ones (not a draft either); a cut in the silence
    # the refinement heard after them keeps both
    for cut, kept in ((60, True), (41, False)):
        request = _request(0, range(0), 200)
        request.last_step = StreamStep(Hypothesis(list(range(7)), "", 0.0,
                                                  [8, 9, 10, 11, 40, 41, 42]),
                                       FrameStats(100, 0, True))
        request.refine = RefineState(refined_frames=70, prefix_tokens=(1, 2),
                                     draft_tokens=(3, 4))
        SegmentCuts.forget_words_past(request, cut)
        assert (request.refine.prefix_tokens, request.refine.draft_tokens) == (
            ((1, 2), (3, 4)) if kept else ((), ()))


def test_the_pause_after_the_last_word_is_heard_from_where_its_sound_ends() -> None:
    """The CTC token of a word's last letter comes before the word's sound ends: the pause
    the audio holds is counted from the sound's end, not from the token."""
    endpointer = Endpointer(EndpointConfig(frame_shift_s=0.02))  # LiveStream.energy's frames
    cuts = SegmentCuts(endpointer, ChunkGeometry(chunk_size=32, subsampling=2),
                       QuietTail())
    # speech to absolute frame 130 (the last word's token at 118), then 20 frames of quiet
    request = _request(100, range(130, 150), 150)
    hyp = Hypothesis([1, 2], "", 0.0, [5, 18])  # segment-relative: frames 105 and 118
    assert cuts.heard_pause(request, hyp) == 20
    # the speaker went on: the audio ends loud, no pause
    request.energy.append(0.3 * np.ones(10 * SAMPLES_PER_FRAME, np.float32))
    assert cuts.heard_pause(request, hyp) == 0
    # a "pause" as loud as the speech is none to tell
    flat = _request(100, range(0), 150)
    assert cuts.heard_pause(flat, hyp) == 0
    assert SegmentCuts(endpointer, ChunkGeometry(32, 2)).heard_pause(request, hyp) == 0
    assert cuts.heard_pause(request, Hypothesis([], "", 0.0, [])) == 0


def test_a_trailing_pause_ends_in_its_middle_not_in_the_next_words_onset() -> None:
    """A silence rule fires at the chunk's end, but the speaker went on before it: the CTC
    pass has not written the next word yet, so its blank frames run into that word's sound.
    The segment ends in the middle of the quiet audio after the last word instead, and the
    next word's sound starts the next segment."""
    endpointer = Endpointer(EndpointConfig(frame_shift_s=0.02))  # LiveStream.energy's frames
    cuts = SegmentCuts(endpointer, ChunkGeometry(chunk_size=32, subsampling=2))
    start, decoded = 100, 96  # the segment's frames so far: absolute 100-195
    # speech to absolute 150 (the last token at 140), a pause 150-184, the next word from 185
    request = _request(start, range(150, 185), start + decoded)
    request.view.num_frames_decoded = start + decoded
    request.ctc_hyp = Hypothesis([1, 2], "", 0.0, [10, 40])  # segment-relative frames
    decision = EndpointDecision("rule2", decoded)  # 55 blank frames: the rule's 1 s passed
    cut = cuts.cut_frame(request, decision)
    assert 150 - start < cut < 185 - start  # in the pause ...
    assert abs((start + cut) - 167) <= 3  # ... about its middle, not its far edge
    # a pause inside the chunk (the endpointer's own cut) stays where it was decided
    assert cuts.cut_frame(request, EndpointDecision("rule2", 60)) == 60
    # no words in the segment (silence alone ended it): the chunk's end
    request.ctc_hyp = Hypothesis([], "", 0.0, [])
    assert cuts.cut_frame(request, decision) == decoded
    # the pause after the last word's sound is all beyond the chunk: the chunk's end
    request.ctc_hyp = Hypothesis([1, 2], "", 0.0, [10, 94])
    assert cuts.cut_frame(request, decision) == decoded
    # a rule that needs no silence (a length with no cut window) ends at the chunk
    every_second = Endpointer(EndpointConfig(
        rule1=None, rule2=None, rule4=None, max_cut_window_s=0.0, frame_shift_s=0.02,
        rule3=EndpointRule(must_contain_speech=False, min_trailing_silence_s=0.0,
                           min_utterance_length_s=1.0)))
    request.ctc_hyp = Hypothesis([1, 2], "", 0.0, [10, 40])
    length = SegmentCuts(every_second, ChunkGeometry(32, 2))
    assert length.cut_frame(request, EndpointDecision("rule3", decoded)) == decoded
    # no endpointer: as decided
    assert SegmentCuts(None, ChunkGeometry(32, 2)).cut_frame(request, decision) == decoded


def test_a_long_trailing_pause_is_cut_no_further_back_than_a_cut_may_reach() -> None:
    """A client's silence rule of many seconds: the pause's quietest stretch may lie far back,
    but the frames after a cut are decoded again and the stream keeps only so many."""
    endpointer = Endpointer(EndpointConfig(frame_shift_s=0.02))  # a 3 s (150 frame) window
    cuts = SegmentCuts(endpointer, ChunkGeometry(chunk_size=32, subsampling=2))
    decoded = 600  # 12 s: speech to frame 100, then quiet, quietest (digital silence) 110-159
    request = _request(0, range(100, decoded), 0)
    rng = np.random.default_rng(1)
    audio = 0.3 * rng.standard_normal(decoded * SAMPLES_PER_FRAME).astype(np.float32)
    audio[100 * SAMPLES_PER_FRAME:] *= 1e-3
    audio[110 * SAMPLES_PER_FRAME:160 * SAMPLES_PER_FRAME] = 0.0
    request.energy.append(audio)
    request.view.num_frames_decoded = decoded
    request.ctc_hyp = Hypothesis([1], "", 0.0, [90])
    cut = cuts.cut_frame(request, EndpointDecision("rule2", decoded))
    assert decoded - cuts.max_cut_back_frames <= cut < decoded
