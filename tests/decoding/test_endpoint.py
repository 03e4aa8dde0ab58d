"""Endpoint rules fire exactly at their thresholds, on counters the decoder tracks."""

import pytest
import torch

from oasr.decoding import (
    EndpointConfig,
    Endpointer,
    EndpointRule,
    FrameStats,
    GpuDecoderConfig,
    GpuStreamingDecoder,
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
    return dec.frame_stats([state])[0]


@pytest.mark.parametrize("beam", [1, 4])
def test_decoder_tracks_trailing_blank_frames(beam: int) -> None:
    assert run("__x_xx___", beam) == FrameStats(9, 3, True)
    assert run("______", beam) == FrameStats(6, 6, False)
    assert run("x" * 10, beam, chunk=3) == FrameStats(10, 0, True)
    assert run("x" + "_" * 20, beam, chunk=3) == FrameStats(21, 20, True)


def test_rule2_fires_at_one_second_after_speech() -> None:
    ep = Endpointer()  # 0.04 s frames: 1.0 s = 25 frames
    assert ep.detect(run("xx" + "_" * 24)) is None
    assert ep.detect(run("xx" + "_" * 25)) == "rule2"
    # No speech: rule 2 never fires, however long the silence before rule 1's 5 s.
    assert ep.detect(run("_" * 124)) is None


def test_rule1_fires_at_five_seconds_without_speech() -> None:
    ep = Endpointer()
    assert ep.detect(FrameStats(124, 124, False)) is None
    assert ep.detect(run("_" * 125, chunk=16)) == "rule1"


def test_rule3_fires_at_twenty_seconds_even_while_speaking() -> None:
    ep = Endpointer()
    assert ep.detect(FrameStats(499, 0, True)) is None
    assert ep.detect(run("x_" * 250, chunk=16)) == "rule3"


def test_rules_are_checked_in_order_and_can_be_disabled() -> None:
    stats = FrameStats(600, 200, True)  # every rule holds
    assert Endpointer().detect(stats) == "rule1"
    assert Endpointer(EndpointConfig(rule1=None)).detect(stats) == "rule2"
    assert Endpointer(EndpointConfig(rule1=None, rule2=None)).detect(stats) == "rule3"
    assert Endpointer(EndpointConfig(rule1=None, rule2=None, rule3=None)).detect(stats) is None


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


def test_endpoint_segment_times() -> None:
    ep = Endpointer()
    got = ep.endpoint(
        FrameStats(num_frames=75, num_trailing_blank_frames=25, has_speech=True), 12.0
    )
    assert got is not None and got.rule == "rule2"
    assert got.start_s == 12.0
    assert got.end_s == pytest.approx(15.0)
    assert got.speech_end_s == pytest.approx(14.0)
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
