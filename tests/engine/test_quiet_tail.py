"""Endpoints between chunks: the quiet audio after a stream's last chunk counts as the rest of
its pause (`QuietTail`, `SegmentCuts.in_quiet`), so a segment ends when its silence is there,
not at the next 640 ms chunk."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import live_stream

from oasr.audio import ChunkGeometry, FrameEnergy
from oasr.decoding import EndpointConfig, Endpointer, Hypothesis, StreamStep
from oasr.decoding.decoder import FrameStats
from oasr.engine import ASREngine, EngineConfig, Final
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.live.quiet_tail import QuietTail
from oasr.engine.live.segment_cuts import SegmentCuts

SR = 16000
SHIFT = 0.02  # the bundled model's encoder frame


def _energy(levels_db: list[float]) -> FrameEnergy:
    """A FrameEnergy whose frames have these levels (dB full scale)."""
    energy = FrameEnergy(320)
    energy.append(np.concatenate([np.full(320, 10 ** (db / 20), np.float32) for db in levels_db]))
    return energy


def test_quiet_frames_run_up_to_the_first_loud_one() -> None:
    tail = QuietTail()
    word, pause = [-20.0] * 10, [-60.0] * 10
    energy = _energy(word + pause + [-58.0] * 7 + [-30.0] * 3 + [-60.0] * 5)
    # decoded: the word and its pause (10 trailing blank frames); then 7 quiet, a loud sound
    assert tail.quiet_run(energy, 20, 10, SHIFT).frames == 7
    assert tail.quiet_run(_energy(word + pause + [-57.0] * 4), 20, 10, SHIFT).frames == 4


def test_a_digitally_silent_pause_is_measured_at_the_floor() -> None:
    # zero padding after the word (the energy's -100 dB), then a voice's faint lead-in at
    # -65 dB: quiet against the -60 dB floor, and the run ends at the next word (-50 dB)
    word, zeros = [-26.0] * 10, [-100.0] * 10
    energy = _energy(word + zeros + [-100.0] * 3 + [-65.0] * 4 + [-50.0] * 3 + [-65.0] * 2)
    assert QuietTail().quiet_run(energy, 20, 10, SHIFT).frames == 7
    assert QuietTail(floor_db=-100.0).quiet_run(energy, 20, 10, SHIFT).frames == 3


def test_a_pause_that_began_at_the_chunks_end_is_measured_on_the_audio_after_it() -> None:
    # the chunk ended one frame after the word's last token (decoded end 11, 1 blank frame);
    # its pause is measured after the 40 ms the word may still fill (frames 12-15)
    tail = QuietTail()
    word = [-20.0] * 11
    assert tail.quiet_run(_energy(word + [-35.0] + [-60.0] * 3), 11, 1, SHIFT).frames == 0  # not yet
    energy = _energy(word + [-35.0] + [-60.0] * 9 + [-30.0] * 3 + [-60.0] * 3)
    # the word's soft end (frame 11) counts, as a blank frame would; the run stops at -30 dB
    assert tail.quiet_run(energy, 11, 1, SHIFT).frames == 10
    # the word goes on after the chunk: its frames are no pause
    assert tail.quiet_run(_energy(word + [-22.0] * 8 + [-60.0] * 4), 11, 1, SHIFT).frames == 0


def test_the_last_words_fade_after_the_measure_is_quiet_too() -> None:
    # as flite's voice ended "... of the world." (a live trace): the chunk ended a frame after
    # the last token (decoded end 11, 1 blank frame); the word fades -43, -45, -50, -57, -70 dB
    # into digital silence, so the pause measured on frames 12-15 has a median of -63.5 dB and
    # frame 12 (-50 dB, the fade) is above its -54 dB bar: the fade's frames are quiet too
    tail = QuietTail()
    word = [-21.0, -20.0, -18.0, -19.0, -20.0, -20.0, -19.0, -22.0, -29.0, -50.0]
    fade = [-43.0, -45.0, -50.0, -57.0, -70.0]
    energy = _energy(word + fade + [-100.0] * 10)
    assert tail.quiet_run(energy, 11, 1, SHIFT).frames == 14  # frames 11-24: all of it
    # the fade ended it (one frame above the pause's bar is a click too: `click_s`)
    assert QuietTail(decay_s=0.0, click_s=0.0).quiet_run(energy, 11, 1, SHIFT).frames == 1
    # a next word after the fade still ends the run where it starts (frame 19)
    assert tail.quiet_run(_energy(word + fade + [-100.0] * 4 + [-25.0] * 3), 11, 1,
                             SHIFT).frames == 8
    # a level that rises first is no fade (a new sound): the run ends there, as before
    # (one frame of it, and quiet after: a click, which does not end the run either)
    rises = _energy(word + [-43.0, -45.0, -44.0, -57.0, -70.0] + [-100.0] * 10)
    assert QuietTail(click_s=0.0).quiet_run(rises, 11, 1, SHIFT).frames == 1
    assert tail.quiet_run(rises, 11, 1, SHIFT).frames == 14


def test_a_pause_after_the_last_words_late_letters_is_measured_against_the_word() -> None:
    # as JFK's "... my fellow Americans" (a live trace): the word's sound ended at frame 10,
    # over room tone at -40 dB; the CTC pass wrote its last letters until frame 18, so its
    # 13 trailing blank frames (decoded end 32) begin 0.36 s into the pause; the loudest frame
    # just before them is room tone, and only looking ``late_s`` further back finds the word
    room = [-40.0, -41.0, -39.0, -42.0]
    levels = [-12.0] * 10 + room * 6 + [-41.0] * 6
    energy = _energy(levels)
    assert QuietTail(late_s=0.0).quiet_run(energy, 32, 13, SHIFT).frames == 0
    assert QuietTail().quiet_run(energy, 32, 13, SHIFT).frames == 8  # frames 32-39
    # a click in the room (one frame at -23 dB) and the pause goes on; a word ends it
    clicked = _energy(levels + [-23.0] + [-40.0] * 5 + [-14.0] * 4)
    run = QuietTail().quiet_run(clicked, 32, 13, SHIFT)
    assert run.frames == 14 and run.went_on  # frames 32-45, the click's among them


def test_a_pause_measured_on_the_words_own_end_is_no_pause() -> None:
    # as the LibriVox reader's "... rather cold hearted | and rather selfish" (a live trace):
    # the chunk ended a frame after "hearted"'s last token, whose sound went on at -26 dB; the
    # pause measured after the chunk (frames 20-23) is that end, and the soft "and" after a
    # 0.08 s gap (-30 dB) is no quieter. The word before the blank frame is within 12 dB of
    # it: no pause, though a louder word lies further back (looked for only when the CTC
    # pass's blank frames hold the pause: `QuietTail.late_s`)
    word = [-14.0] * 10 + [-22.0, -25.0, -23.0, -24.0, -27.0, -22.0, -25.0, -26.0, -28.0]
    after = [-26.0, -26.0, -27.0, -34.0] + [-41.0, -42.0, -42.0, -40.0]
    soft = [-32.0, -30.0, -31.0, -30.0, -32.0, -31.0, -31.0, -33.0, -30.0, -31.0]
    energy = _energy(word + after + soft + [-26.0, -23.0, -23.0, -24.0])
    assert QuietTail().quiet_run(energy, 19, 1, SHIFT).frames == 0


def test_a_pause_measured_on_a_next_words_onset_is_no_pause() -> None:
    # as the LibriVox reader's "... and rather selfish, | is to be ill-disposed" (a live
    # trace): the chunk ended at "selfish"'s end, with no blank frame; the audio after it dips
    # for 60 ms and the soft "is to be" starts: the pause measured after the 40 ms skip
    # (-43, -37, -29, -31) is that onset, and the phrase, within 6 dB of it, counted as 0.5 s
    # of quiet, so the sentence rule cut the sentence there. A pause stays level or dies away
    word = [-31.0, -32.0, -32.0, -31.0, -32.0, -35.0, -19.0, -18.0, -18.0, -20.0, -24.0,
            -23.0, -28.0, -31.0]
    after = [-47.0, -49.0, -43.0, -37.0, -29.0, -31.0, -33.0, -33.0, -36.0, -38.0, -39.0,
             -38.0, -32.0, -28.0, -26.0, -27.0, -29.0, -29.0, -29.0, -31.0, -31.0, -33.0,
             -35.0, -41.0, -45.0, -42.0, -41.0, -34.0]
    energy = _energy(word + after)
    assert QuietTail().quiet_run(energy, len(word), 0, SHIFT).frames == 0
    # the same chunk end with the word's fade and room tone after it is a pause
    fade = [-47.0, -49.0, -50.0, -48.0, -51.0, -49.0] + [-50.0, -48.0, -49.0, -51.0] * 5
    assert QuietTail().quiet_run(_energy(word + fade), len(word), 0, SHIFT).frames == len(fade)
    # after digital silence a voice's faint lead-in (-65 dB) is no rise: both are the floor
    lead_in = [-100.0, -100.0, -100.0, -65.0, -100.0, -100.0] + [-100.0] * 10
    assert QuietTail().quiet_run(_energy(word + lead_in), len(word), 0, SHIFT).frames == 16


def test_the_quiet_after_a_word_the_ctc_pass_has_not_decoded() -> None:
    tail = QuietTail()
    started = [-20.0] * 10  # decoded: the word's start (decoded end 10)
    assert tail.pause_after_speech(_energy(started + [-20.0] * 5 + [-60.0] * 8), 10, SHIFT) == 8
    # noise under the pause moves its level, not the count
    assert tail.pause_after_speech(_energy(started + [-20.0] * 5 + [-48.0, -52.0] * 4), 10,
                                   SHIFT) == 8
    assert tail.pause_after_speech(_energy(started + [-60.0] * 8), 10, SHIFT) == 0  # no word
    # still speaking (the last frames are loud), or a "word" too faint to tell from the pause
    assert tail.pause_after_speech(_energy(started + [-20.0] * 5 + [-60.0] * 8 + [-20.0] * 2),
                                   10, SHIFT) == 0
    assert tail.pause_after_speech(_energy(started + [-50.0] * 5 + [-60.0] * 8), 10, SHIFT) == 0
    assert tail.pause_after_speech(_energy(started + [-60.0] * 3), 10, SHIFT) == 0  # too little


def test_a_rooms_hum_peaking_for_a_frame_is_no_word_after_the_pause() -> None:
    # the devset reader's "... is to be ill-disposed." (traced, 20 ms frames): the word's end
    # after the decoded audio (its release at -35.9), then room tone whose single frames
    # peak 6-10 dB over its median (-41.1)
    word_end = [-26.7, -29.7, -27.6, -29.1, -28.3, -34.7, -44.8, -46.7, -35.9]
    room = [-41.4, -44.3, -44.7, -41.1, -46.1, -44.0, -44.4, -47.2, -46.8, -46.8,
            -50.5, -50.9, -49.9, -41.1, -45.5, -50.5, -48.5, -47.7]
    tail = QuietTail()
    # (the release's frame after it is the word's too)
    assert tail.pause_after_speech(_energy([-24.0] * 10 + word_end + room), 10,
                                   SHIFT) == len(room) - 1
    # three loud frames are a sound (a short word): the pause starts after it
    word = [-47.0] * 6 + [-28.0] * 3 + [-47.0] * 6
    assert tail.pause_after_speech(_energy([-24.0] * 10 + word_end + word), 10, SHIFT) == 6
    # one loud frame that the audio so far ends may be a word's onset: no pause yet
    assert tail.pause_after_speech(_energy([-24.0] * 10 + word_end + room + [-28.0]), 10,
                                   SHIFT) == 0
    # a short burst near the word's level is a word's: JFK's "... can do for | you" in a
    # reverberant room, a dip to -34 dB, then "y" rising to -18 for two frames (traced): no
    # pause there (taken for a click, it started an early decode before "you" was said)
    dip = [-13.9, -14.8, -15.8, -16.9, -18.9, -24.0, -26.6, -30.0, -31.9, -31.8, -34.6, -34.2,
           -20.7, -17.8, -19.2, -24.1, -27.3, -26.8, -25.4, -21.0]
    assert tail.pause_after_speech(_energy([-14.0] * 10 + dip), 10, SHIFT) == 0


def test_speech_after_the_quiet_run_says_the_speaker_went_on() -> None:
    tail = QuietTail()
    word, pause = [-20.0] * 10, [-60.0] * 10
    decoded = word + pause + [-60.0] * 6  # decoded: the word and its pause; 6 quiet after
    run = tail.quiet_run(_energy(decoded + [-45.0, -28.0, -24.0, -22.0]), 20, 10, SHIFT)
    assert run.frames == 6 and run.went_on  # a word, rising to speech's level
    # not yet: one frame of it (a word's onset, or a click)
    assert not tail.quiet_run(_energy(decoded + [-24.0]), 20, 10, SHIFT).went_on
    # a click: loud for a frame, then quiet again; the quiet run goes on through it
    click = tail.quiet_run(_energy(decoded + [-18.0] + [-60.0] * 6), 20, 10, SHIFT)
    assert click.frames == 13 and not click.went_on
    assert QuietTail(click_s=0.0).quiet_run(_energy(decoded + [-18.0] + [-60.0] * 6), 20, 10,
                                            SHIFT).frames == 6
    # a breath: above the pause for long, but 20 dB under the word
    assert not tail.quiet_run(_energy(decoded + [-40.0] * 8), 20, 10, SHIFT).went_on
    # still quiet
    still = tail.quiet_run(_energy(decoded + [-60.0] * 4), 20, 10, SHIFT)
    assert still.frames == 10 and not still.went_on


def test_between_chunks_the_pause_heard_says_when_speech_followed_it() -> None:
    # SegmentCuts.in_quiet hands the pause to the engine (an early decode is dropped on
    # went_on); each check counts only when new audio arrived
    cuts = SegmentCuts(Endpointer(EndpointConfig.wenet_quiet_cut()), ChunkGeometry())
    cuts.quiet = QuietTail()
    request = live_stream()
    request.view.num_frames_decoded = 20
    request.last_step = StreamStep(Hypothesis([5, 6], "5 6", 0.0, [3, 8]),
                                   FrameStats(20, 10, True))
    levels = [-20.0] * 10 + [-60.0] * 16
    request.energy = _energy(levels)
    decision, pause = cuts.in_quiet(request)
    assert decision is None and pause is not None  # 0.32 s of pause: no rule's silence yet
    assert (pause.frames, pause.speech_end, pause.went_on) == (16, 10, False)
    assert cuts.in_quiet(request) == (None, None)  # nothing new
    request.energy.append(np.concatenate(
        [np.full(320, 10 ** (db / 20), np.float32) for db in [-30.0, -22.0, -21.0]]))
    decision, pause = cuts.in_quiet(request)
    assert decision is None and pause is not None
    assert (pause.frames, pause.went_on) == (16, True)


def test_no_quiet_frames_without_a_pause_to_measure() -> None:
    tail = QuietTail()
    # a "pause" as loud as the word (speech the CTC pass missed) is no reference
    loud = _energy([-20.0] * 10 + [-26.0] * 10 + [-26.0] * 5)
    assert tail.quiet_run(loud, 20, 10, SHIFT).frames == 0
    with pytest.raises(ValueError, match="durations out of range"):
        QuietTail(min_pause_s=0.0)
    with pytest.raises(ValueError, match="decay_s -0.1"):
        QuietTail(decay_s=-0.1)
    with pytest.raises(ValueError, match="resume_s 0"):
        QuietTail(resume_s=0.0)
    with pytest.raises(ValueError, match="late_s -0.1"):
        QuietTail(late_s=-0.1)
    with pytest.raises(ValueError, match="click_s -0.02"):
        QuietTail(click_s=-0.02)


def _stream(audio: np.ndarray, quiet: bool,
            light_load_streams: int = 2) -> tuple[list[tuple[float, Final]], int]:
    """``audio`` sent live in 0.1 s pieces with engine steps between; each final with the
    seconds of audio sent when it came, and the endpoints decided between chunks."""
    config = EngineConfig(max_batch_size=1, max_num_blocks=64, num_threads=1,
                          second_pass="none", endpoint_quiet=QuietTail() if quiet else None,
                          light_load_streams=light_load_streams)
    engine = ASREngine(config)
    finals: list[tuple[float, Final]] = []
    sent = [0.0]
    engine.submit(OpenStream(1, lambda e: finals.append((sent[0], e))
                             if isinstance(e, Final) else None))
    for i in range(0, len(audio), SR // 10):
        engine.submit(AppendAudio(1, audio[i: i + SR // 10]))
        sent[0] = min(i + SR // 10, len(audio)) / SR
        for _ in range(3):
            engine.step()
    engine.submit(EndStream(1))
    while engine.requests:
        engine.step()
    return finals, engine.latest_stats().num_quiet_endpoints


@pytest.mark.slow
@pytest.mark.parametrize("noise_db", [None, -50.0])
def test_a_segment_ends_when_its_silence_is_there(speech: list[np.ndarray],
                                                  noise_db: float | None) -> None:
    gap = np.zeros(int(2.0 * SR), np.float32)
    audio = np.concatenate([gap[: SR // 2], speech[0], gap, speech[1], gap])
    if noise_db is not None:  # a quiet room, not digital silence
        rng = np.random.default_rng(0)
        audio = audio + rng.normal(0, 10 ** (noise_db / 20), len(audio)).astype(np.float32)
    at_chunks, none = _stream(audio, quiet=False)
    between, num_quiet = _stream(audio, quiet=True)
    assert none == 0 and num_quiet >= 2
    # the same segments; the first has the same text (the next ones start at another frame,
    # so their chunks fall elsewhere and the CTC spelling may move)
    assert len(between) == len(at_chunks) and between[0][1].text == at_chunks[0][1].text
    for (late, _), (early, final) in zip(at_chunks, between[:-1], strict=False):
        # WeNet's 1 s of silence after the last word, within the 0.1 s the client sends
        assert 1.0 <= early - final.end <= 1.2, (early, final)
        assert early <= late
    lags = [late - early for (late, _), (early, _) in zip(at_chunks[:-1], between[:-1],
                                                         strict=True)]
    assert max(lags) > 0.1, lags  # at least one final came a client frame or more earlier


@pytest.mark.slow
def test_above_a_demos_load_segments_end_at_chunks(speech: list[np.ndarray]) -> None:
    # more live streams than light_load_streams (here: any): the shorter segments would be
    # more finals to decode at once, so the chunk rule decides, as with the quiet rule off
    gap = np.zeros(int(2.0 * SR), np.float32)
    audio = np.concatenate([gap[: SR // 2], speech[0], gap, speech[1], gap])
    at_chunks, _ = _stream(audio, quiet=False)
    loaded, num_quiet = _stream(audio, quiet=True, light_load_streams=0)
    assert num_quiet == 0
    assert [(sent, f.end) for sent, f in loaded] == [(sent, f.end) for sent, f in at_chunks]


@pytest.mark.slow
def test_noise_after_the_last_word_is_no_silence(speech: list[np.ndarray]) -> None:
    # loud noise (as loud as the speech) after the words: the CTC pass hears blank, the
    # audio says it is not quiet, so the segment waits for its chunk
    rng = np.random.default_rng(1)
    level = float(np.sqrt(np.mean(speech[0] ** 2)))
    noise = rng.normal(0, level, int(2.0 * SR)).astype(np.float32)
    audio = np.concatenate([np.zeros(SR // 2, np.float32), speech[0], noise])
    _, num_quiet = _stream(audio, quiet=True)
    assert num_quiet == 0
