"""Endpoint rules fire exactly at their thresholds, on counters the decoder tracks."""

import numpy as np
import pytest
import torch

from oasr.decoding import (
    EndpointConfig,
    EndpointDecision,
    Endpointer,
    EndpointRule,
    FrameStats,
    GpuDecoderConfig,
    GpuStreamingDecoder,
    quiet_middle,
    quietest_frame,
)

V = 4


def frames(pattern: str) -> torch.Tensor:
    """(1, T, V) log-probs whose argmax is blank for '_' and token 2 for 'x'."""
    lp = torch.full((1, len(pattern), V), -5.0)
    for t, ch in enumerate(pattern):
        lp[0, t, 0 if ch == "_" else 2] = -0.01
    return lp


def run(pattern: str, beam: int = 1, chunk: int = 7) -> FrameStats:
    dec = GpuStreamingDecoder(GpuDecoderConfig(beam_size=beam), device="cpu")
    state = dec.create_state(1, V)
    lp = frames(pattern)
    for lo in range(0, lp.shape[1], chunk):
        dec.decode_chunk(lp[:, lo : lo + chunk], state)
    return dec.partials([state])[0].stats


@pytest.mark.parametrize("beam", [1, 4])
def test_decoder_tracks_trailing_blank_frames(beam: int) -> None:
    assert run("__x_xx___", beam) == FrameStats(9, 3, True)
    assert run("______", beam) == FrameStats(6, 6, False)
    assert run("x" * 10, beam, chunk=3) == FrameStats(10, 0, True)
    assert run("x" + "_" * 20, beam, chunk=3) == FrameStats(21, 20, True)


def test_rule4_fires_at_1_2_seconds_after_any_speech() -> None:
    ep = Endpointer()  # 0.04 s frames: 1.2 s = 30 frames
    assert ep.detect(run("xx" + "_" * 29)) is None
    assert ep.detect(run("xx" + "_" * 30)) == "rule4"
    # No speech: rule 4 never fires, however long the silence before rule 1's 5 s.
    assert ep.detect(run("_" * 124)) is None


def test_rule1_fires_at_five_seconds_without_speech() -> None:
    ep = Endpointer()
    assert ep.detect(FrameStats(124, 124, False)) is None
    assert ep.detect(run("_" * 125, chunk=16)) == "rule1"


def test_rule3_fires_at_fifteen_seconds_even_while_speaking() -> None:
    ep = Endpointer()  # 15 s = 375 frames
    assert ep.detect(FrameStats(374, 0, True)) is None
    assert ep.detect(run("x_" * 188, chunk=16)) == "rule3"
    got = ep.decide(FrameStats(375, 0, True), [2], [0])
    assert got == EndpointDecision("rule3", 375, is_length_cut=True)
    no_window = Endpointer(EndpointConfig(max_cut_window_s=0.0))
    assert no_window.decide(FrameStats(375, 0, True), [2], [0]) == EndpointDecision(
        "rule3", 375, is_length_cut=False)


def test_rules_are_checked_in_order_and_can_be_disabled() -> None:
    stats = FrameStats(600, 200, True)  # every trailing rule holds
    assert Endpointer().detect(stats) == "rule1"
    assert Endpointer(EndpointConfig(rule1=None)).detect(stats) == "rule4"
    assert Endpointer(EndpointConfig(rule1=None, rule4=None)).detect(stats) == "rule3"
    off = EndpointConfig(rule1=None, rule2=None, rule3=None, rule4=None)
    assert Endpointer(off).detect(stats) is None


def test_wenet_rules_are_the_old_defaults() -> None:
    ep = Endpointer(EndpointConfig.wenet())
    assert ep.detect(FrameStats(26, 24, True)) is None
    assert ep.detect(FrameStats(26, 25, True)) == "rule2"  # 1 s after speech, no word count
    assert ep.decide(FrameStats(500, 0, True), [2], [0]) == EndpointDecision("rule3", 500)


def test_the_default_rules_are_wenets_with_the_length_cut_at_a_quiet_point() -> None:
    from oasr.engine import EngineConfig

    ep = Endpointer(EndpointConfig.wenet_quiet_cut())
    assert ep.detect(FrameStats(26, 24, True)) is None
    assert ep.detect(FrameStats(26, 25, True)) == "rule2"  # WeNet's 1 s after speech
    assert ep.decide(FrameStats(499, 0, True), [2], [0]) is None
    assert ep.decide(FrameStats(500, 0, True), [2], [0]) == EndpointDecision(
        "rule3", 500, is_length_cut=True)  # 20 s: the engine cuts in the last 3 s
    assert ep.max_cut_window_frames == 75
    assert EngineConfig().endpoint == EndpointConfig.wenet_quiet_cut()


def test_custom_thresholds_and_frame_shift() -> None:
    cfg = EndpointConfig(
        rule2=EndpointRule(
            must_contain_speech=True, min_trailing_silence_s=0.3, min_utterance_length_s=0.5
        ),
        frame_shift_s=0.1,
    )
    ep = Endpointer(cfg)
    assert ep.detect(FrameStats(5, 2, True)) is None  # 0.2 s silence
    assert ep.detect(FrameStats(4, 3, True)) is None  # 0.4 s segment
    assert ep.detect(FrameStats(5, 3, True)) == "rule2"


# rule 2 (0.8 s = 20 frames at 0.04 s, after 3 words; certain at rule 4's 1.2 s = 30 frames,
# or when 2 words follow): words are runs of tokens between separators (id 9 here), pauses are
# gaps between the speech tokens' frames.
SEP = 9
THREE_WORDS = ([2, 2, SEP, 3, SEP, 2], [0, 2, 3, 5, 6, 8])  # words at frames 0-2, 5, 8


def test_rule2_trailing_pause_waits_for_a_last_word_until_it_is_certain() -> None:
    ep = Endpointer(separator_ids=[SEP])
    tokens, times = THREE_WORDS
    assert ep.decide(FrameStats(28, 19, True), tokens, times) is None  # 19 frames
    assert ep.decide(FrameStats(29, 20, True), tokens, times) is None  # a word may follow
    assert ep.decide(FrameStats(38, 29, True), tokens, times) is None
    assert ep.decide(FrameStats(39, 30, True), tokens, times) == EndpointDecision("rule2", 39)
    at_once = Endpointer(EndpointConfig(tail_words=0), separator_ids=[SEP])
    assert at_once.decide(FrameStats(29, 20, True), tokens, times) == EndpointDecision("rule2", 29)


def test_rule2_needs_three_words_before_the_pause() -> None:
    ep = Endpointer(separator_ids=[SEP])
    tokens, times = [2, 2, SEP, 3], [0, 2, 3, 5]  # two words
    assert ep.decide(FrameStats(30, 24, True), tokens, times) is None
    # rule 4 (1.2 s = 30 frames) ends a short utterance
    assert ep.decide(FrameStats(36, 30, True), tokens, times) == EndpointDecision("rule4", 36)


def test_rule2_pause_followed_by_two_words_cuts_in_its_middle() -> None:
    ep = Endpointer(separator_ids=[SEP])
    tokens, times = THREE_WORDS
    # a 21-frame gap (frames 9-29), then words at 30 and 33: cut after frame 9 + 21 // 2 = 19
    two = [*tokens, SEP, 4, SEP, 4], [*times, 29, 30, 31, 33]
    assert ep.decide(FrameStats(36, 2, True), *two) == EndpointDecision("rule2", 19)
    # one word so far after the pause: wait and see
    assert ep.decide(FrameStats(34, 2, True), [*tokens, SEP, 4], [*times, 29, 30]) is None
    # a 19-frame gap is a breath: no cut
    assert ep.decide(FrameStats(36, 2, True), [*tokens, 4, SEP, 4], [*times, 28, 31, 33]) is None


def test_rule2_keeps_a_last_word_read_after_a_pause() -> None:
    ep = Endpointer(separator_ids=[SEP])
    tokens, times = THREE_WORDS
    last = [*tokens, SEP, 4], [*times, 29, 30]  # "... comparison | only"
    assert ep.decide(FrameStats(50, 19, True), *last) is None
    # the pause after "only": the segment ends there, "only" in it
    assert ep.decide(FrameStats(51, 20, True), *last) == EndpointDecision("rule2", 51)
    # speech already resumed after that pause: cut in its middle (31 + 29 // 2 = 45)
    resumed = [*tokens, SEP, 4, SEP, 5], [*times, 29, 30, 59, 60]
    assert ep.decide(FrameStats(62, 1, True), *resumed) == EndpointDecision("rule2", 45)


def test_rule2_decides_a_pause_that_is_too_old_to_wait_for() -> None:
    ep = Endpointer(separator_ids=[SEP])  # 3 s = 75 frames
    tokens, times = THREE_WORDS
    long_word = [*tokens, SEP, *[4] * 30], [*times, 29, *range(30, 90, 2)]  # one 2.4 s word
    assert ep.decide(FrameStats(93, 2, True), *long_word) is None  # 93 - 19 = 74 frames back
    assert ep.decide(FrameStats(94, 3, True), *long_word) == EndpointDecision("rule2", 19)


def test_separators_are_not_speech() -> None:
    ep = Endpointer(separator_ids=[SEP])
    tokens, times = THREE_WORDS
    # a separator emitted in the middle of the pause does not split it
    two = [*tokens, SEP, 4, SEP, 4], [*times, 19, 30, 31, 33]
    assert ep.decide(FrameStats(36, 2, True), *two) == EndpointDecision("rule2", 19)
    # without the separator id, the same tokens hold no 20-frame gap
    assert Endpointer().decide(FrameStats(36, 2, True), *two) is None


def test_quietest_frame_prefers_a_pause_to_one_quiet_frame() -> None:
    energy = np.full(40, -20.0)
    energy[5] = -90.0  # one quiet frame inside speech
    energy[20:26] = -60.0  # a pause
    assert quietest_frame(energy) == 23
    assert quietest_frame(np.array([-30.0, -50.0, -50.0]), smooth_frames=1) == 2  # latest tie
    with pytest.raises(ValueError, match="at least one frame"):
        quietest_frame(np.zeros(0))


def test_endpoint_segment_times() -> None:
    ep = Endpointer()
    got = ep.endpoint(
        FrameStats(num_frames=75, num_trailing_blank_frames=30, has_speech=True), 12.0
    )
    assert got is not None and got.rule == "rule4"
    assert got.start_s == 12.0
    assert got.end_s == pytest.approx(15.0)
    assert got.speech_end_s == pytest.approx(13.8)
    silent = ep.endpoint(FrameStats(125, 125, False), 3.0)
    assert silent is not None and silent.speech_end_s == 3.0
    assert ep.endpoint(FrameStats(10, 2, True)) is None


def test_endpoint_config_validation() -> None:
    with pytest.raises(ValueError, match="fires on every frame"):
        EndpointRule(must_contain_speech=False, min_trailing_silence_s=0.0)
    with pytest.raises(ValueError, match="must be >= 0 s"):
        EndpointRule(must_contain_speech=True, min_trailing_silence_s=-1.0)
    with pytest.raises(ValueError, match="frame_shift_s must be > 0, got 0"):
        EndpointConfig(frame_shift_s=0)
    with pytest.raises(ValueError, match="min_words must be >= 0, got -1"):
        EndpointRule(must_contain_speech=True, min_trailing_silence_s=0.5, min_words=-1)
    with pytest.raises(ValueError, match="min_words 2 needs a speech rule"):
        EndpointRule(must_contain_speech=False, min_trailing_silence_s=0.5, min_words=2)
    with pytest.raises(ValueError, match="tail_words must be >= 0, got -1"):
        EndpointConfig(tail_words=-1)
    with pytest.raises(ValueError, match="max_cut_window_s must be >= 0, got -1"):
        EndpointConfig(max_cut_window_s=-1)



def test_quiet_middle_is_the_middle_of_the_quietest_pause_not_its_edge() -> None:
    energy = np.full(60, -20.0)  # speech
    energy[10:12] = -45.0  # a short dip inside a word
    energy[30:50] = -100.0  # digital silence between sentences
    energy[50] = -70.0  # the next word's soft onset
    assert 37 <= quiet_middle(energy) <= 42  # about halfway along the silence (30-49)
    assert quietest_frame(energy) == 47  # (the latest quiet frame: the silence's far edge)
    # a noisy pause: frames within the margin of its quietest count as the pause
    rng = np.random.default_rng(0)
    noisy = np.full(60, -20.0)
    noisy[20:40] = -60.0 + rng.uniform(-2.0, 2.0, 20)
    assert 27 <= quiet_middle(noisy) <= 32
    assert quiet_middle(np.array([-50.0])) == 0
    with pytest.raises(ValueError, match="at least one frame"):
        quiet_middle(np.zeros(0))
