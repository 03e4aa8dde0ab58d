"""The encoder on a segment's real length: window arithmetic, the frontend's and encoder's short
inputs, the silent tail, and (real model) the devset's WER against the whole 30 s window."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from whisper_devset import dense_search
from whisper_testutil import TINY, tiny_model

from oasr.engine import EngineConfig
from oasr.engine.options import add_engine_arguments, engine_config_from_args
from oasr.models.whisper import WhisperCheckpoint, WhisperFrontend
from oasr.models.whisper import window as window_module
from oasr.models.whisper.dense_kv import DecoderKv
from oasr.models.whisper.frontend import N_FRAMES
from oasr.models.whisper.window import EncoderWindow, SegmentEncoder
from oasr.text.wer import ErrorCounts, normalize_transcript


def test_window_frames_round_the_segment_plus_margin_up_to_a_bucket() -> None:
    fit = EncoderWindow()  # 2 s margin, 0.5 s buckets
    assert fit.bucket_frames == 50
    assert fit.num_frames(5 * 16000, N_FRAMES) == 700  # exactly 7 s
    assert fit.num_frames(5 * 16000 + 1, N_FRAMES) == 750  # 7 s and a sample -> 7.5 s
    assert fit.num_frames(int(5.2 * 16000), N_FRAMES) == 750
    assert fit.num_frames(0, N_FRAMES) == 200  # the margin alone
    wide = EncoderWindow(margin_s=2.0, bucket_s=2.0)
    assert wide.num_frames(5 * 16000, N_FRAMES) == 800  # 7 s -> 8 s
    assert wide.num_frames(6 * 16000 + 1, N_FRAMES) == 1000
    assert fit.num_frames(29 * 16000, N_FRAMES) == N_FRAMES  # capped at the window
    assert EncoderWindow("full").num_frames(16000, N_FRAMES) == N_FRAMES
    odd = EncoderWindow(margin_s=0.0, bucket_s=0.15)
    assert odd.bucket_frames == 16  # 15 frames rounded up to even
    assert odd.num_frames(2560, 40) == 16 and odd.num_frames(2561, 40) == 32


def test_window_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="mode must be one of .*'fit'.*got 'short'"):
        EncoderWindow("short")
    with pytest.raises(ValueError, match="margin_s must be >= 0 seconds, got -1"):
        EncoderWindow(margin_s=-1.0)
    with pytest.raises(ValueError, match="bucket_s must be > 0 seconds, got 0"):
        EncoderWindow(bucket_s=0.0)


def test_short_frontend_window_is_the_prefix_of_the_30s_window() -> None:
    gen = torch.Generator().manual_seed(3)
    waves = [0.1 * torch.randn(3 * 16000 + 37, generator=gen), 0.3 * torch.randn(8000, generator=gen)]
    frontend = WhisperFrontend()
    whole = frontend(waves)
    for frames in (302, 400, 2000):
        assert torch.equal(frontend(waves, frames), whole[:, :, :frames])
    with pytest.raises(ValueError, match=r"48037 samples \(3.00 s\); this window holds at most 48000"):
        frontend(waves, 300)
    with pytest.raises(ValueError, match="num_frames must be in 1..3000, got 3001"):
        frontend(waves, 3001)


def test_encoder_takes_a_prefix_and_only_its_positions() -> None:
    model = tiny_model(seed=4)
    mel = torch.randn(2, TINY.n_mels, 16)
    with torch.inference_mode():
        short = model.encoder(mel)
        assert short.shape == (2, 8, TINY.n_audio_state)
        # not a constant shift: every LayerNorm would remove that exactly
        bump = torch.linspace(-5.0, 5.0, TINY.n_audio_state)
        model.encoder.positions[8:] += bump  # rows past the input: unused
        assert torch.equal(model.encoder(mel), short)
        model.encoder.positions[7] += bump  # the last row used
        assert not torch.allclose(model.encoder(mel), short)
    for shape in ((2, TINY.n_mels, 15), (2, TINY.n_mels, 42), (2, TINY.n_mels + 1, 16), (2, TINY.n_mels, 0)):
        with pytest.raises(ValueError, match=r"T even and 2 <= T <= 40, got"):
            model.encoder(torch.zeros(shape))


def test_fit_mode_encodes_each_bucket_and_completes_with_silence() -> None:
    model = tiny_model(seed=5)  # a 0.4 s window: 40 mel frames, 20 encoder frames
    window = EncoderWindow(margin_s=0.05, bucket_s=0.1)  # 10-frame buckets
    encoder = SegmentEncoder(model, window)
    gen = torch.Generator().manual_seed(6)
    waves = [0.2 * torch.randn(n, generator=gen) for n in (2400, 800, 6400, 700)]
    assert [window.num_frames(w.numel(), 40) for w in waves] == [20, 10, 40, 10]
    frontend = WhisperFrontend(TINY.n_mels)
    with torch.inference_mode():
        states = encoder(waves)
        silence = model.encoder(frontend([torch.zeros(1)], 40))[0]
        assert states.shape == (4, TINY.n_audio_ctx, TINY.n_audio_state)
        for row, frames in ((0, 20), (1, 10), (3, 10)):
            alone = model.encoder(frontend([waves[row]], frames))[0]  # (frames / 2, d)
            torch.testing.assert_close(states[row, : frames // 2], alone)
            torch.testing.assert_close(states[row, frames // 2 :], silence[frames // 2 :])
        whole = model.encoder(frontend([waves[2]], 40))[0]
        torch.testing.assert_close(states[2], whole)
        full = SegmentEncoder(model, EncoderWindow("full"))
        torch.testing.assert_close(full(waves), model.encoder(frontend(waves, 40)))
        assert full.encode(waves).num_encoded == (20, 20, 20, 20)
        encoded = encoder.encode(waves)
        assert encoded.num_encoded == (10, 5, 20, 5)
        cross = encoder.cross_kv(encoded)  # silent frames' K/V from the cached projection
        for (k, v), (k_ref, v_ref) in zip(cross, model.decoder.cross_kv(states), strict=True):
            assert k.shape == (4, TINY.n_audio_ctx, TINY.n_audio_head, 16)
            torch.testing.assert_close(k, k_ref)
            torch.testing.assert_close(v, v_ref)
        # stored head-major, which a DecoderKv keeps as it is (no copy) and attends to as it
        # does to a copy
        assert all(k.transpose(1, 2).is_contiguous() for k, _ in cross)
        copied = DecoderKv([(k.contiguous(), v.contiguous()) for k, v in cross], 4,
                           shared_cross=True)
        kept = DecoderKv(cross, 4, shared_cross=True)
        assert kept._cross[0][0].data.data_ptr() == cross[0][0].data_ptr()
        assert copied._cross[0][0].data.data_ptr() != cross[0][0].data_ptr()
        q = torch.randn(4, 1, TINY.n_audio_head, 16, generator=gen)
        assert torch.equal(kept.attend_cross(1, q), copied.attend_cross(1, q))
    assert [g.rows for g in encoder.features(waves)] == [(1, 3), (0,), (2,)]
    with pytest.raises(ValueError, match="at least one waveform, got 0"):
        encoder([])


def test_split_cross_kv_is_the_window_in_two_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows' own frames (up to the most any row encoded) and the silent window's tail, once:
    joined they are ``cross_kv``'s window, and a DecoderKv over the two parts attends as one
    over the window, also after a group leaves. One row, or rows encoded past
    ``SPLIT_MAX_OWN`` frames, keep the whole window."""
    model = tiny_model(seed=5)  # 20 encoder frames
    encoder = SegmentEncoder(model, EncoderWindow(margin_s=0.05, bucket_s=0.1))
    gen = torch.Generator().manual_seed(7)
    waves = [0.2 * torch.randn(n, generator=gen) for n in (2400, 800, 700)]
    with torch.inference_mode():
        encoded = encoder.encode(waves)
        assert encoded.num_encoded == (10, 5, 5)
        whole = encoder.cross_kv(encoded)
        own, tail = encoder.split_cross_kv(encoded)
        assert tail is not None
        heads = TINY.n_audio_head
        for (k, v), (k_own, v_own), (k_tail, v_tail) in zip(whole, own, tail, strict=True):
            assert k_own.shape == (3, 10, heads, 16) and k_tail.shape == (1, 10, heads, 16)
            assert k_own.transpose(1, 2).is_contiguous()  # kept by DecoderKv without a copy
            assert torch.equal(torch.cat([k_own, k_tail.expand(3, -1, -1, -1)], 1), k)
            assert torch.equal(torch.cat([v_own, v_tail.expand(3, -1, -1, -1)], 1), v)
        split = DecoderKv(own, 4, shared_cross=True, shared_tail=tail)
        full = DecoderKv(whole, 4, shared_cross=True)
        for layer in range(TINY.n_text_layer):
            q = torch.randn(3, 2, heads, 16, generator=gen)
            torch.testing.assert_close(split.attend_cross(layer, q), full.attend_cross(layer, q),
                                       atol=1e-5, rtol=1e-5)
        assert split.keep_groups([0, 2]) == full.keep_groups([0, 2])
        q = torch.randn(2, 1, heads, 16, generator=gen)
        torch.testing.assert_close(split.attend_cross(0, q), full.attend_cross(0, q),
                                   atol=1e-5, rtol=1e-5)
        assert encoder.split_cross_kv(encoder.encode(waves[:1]))[1] is None
        monkeypatch.setattr(window_module, "SPLIT_MAX_OWN", 9)
        kept, no_tail = encoder.split_cross_kv(encoded)
        assert no_tail is None and kept[0][0].shape == whole[0][0].shape


def _devset_wer(checkpoint: WhisperCheckpoint, recordings, hyps) -> ErrorCounts:
    counts = ErrorCounts()
    for rec, hyp in zip(recordings, hyps, strict=True):
        counts.add(rec.reference, normalize_transcript(checkpoint.tokenizer.decode(hyp.tokens)))
    return counts


@pytest.mark.slow
def test_fit_window_keeps_the_devset_wer(checkpoint: WhisperCheckpoint, recordings,
                                         dense_hyps) -> None:
    """The default window (segment + 2 s in 0.5 s buckets, silent tail) scores within a point of
    the 30 s window, and does not loop (a cut window without the silent tail does)."""
    fit = SegmentEncoder(checkpoint.model, EncoderWindow())
    fit_hyps = dense_search(checkpoint, fit([r.waveform for r in recordings]))
    full_wer = _devset_wer(checkpoint, recordings, dense_hyps).wer
    fit_wer = _devset_wer(checkpoint, recordings, fit_hyps).wer
    tokens = [sum(len(h.tokens) for h in hyps) for hyps in (dense_hyps, fit_hyps)]
    print(f"devset WER: 30 s window {full_wer:.2f}%, fit window {fit_wer:.2f}%; tokens {tokens}")
    assert abs(fit_wer - full_wer) <= 1.0
    assert tokens[1] <= math.ceil(1.1 * tokens[0])
    george = next(r for r in recordings if r.name == "real_george_3.wav")
    frames = EncoderWindow().num_frames(george.waveform.numel(), N_FRAMES)
    with torch.inference_mode():
        cut = checkpoint.model.encoder(fit.frontend([george.waveform], frames))
    looped = dense_search(checkpoint, cut)[0]
    assert len(looped.tokens) > 3 * len(fit_hyps[recordings.index(george)].tokens)


def test_second_pass_window_option_reaches_the_finals_decode() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    default = engine_config_from_args(parser.parse_args(["--lm", "none"]))
    assert default.second_pass_decode.encoder_window == EncoderWindow("fit")
    assert default.second_pass_decode == EngineConfig().second_pass_decode  # CLI = library
    full = engine_config_from_args(parser.parse_args(["--lm", "none",
                                                      "--second-pass-window", "full"]))
    assert full.second_pass_decode.encoder_window == EncoderWindow("full")
    assert full.second_pass_decode.beam_size == default.second_pass_decode.beam_size == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["--second-pass-window", "short"])
