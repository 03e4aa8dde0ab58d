"""Feature-space augmentation of the Whisper-CTC recipe: each transform against what the causal
log-mel frontend computes from correspondingly changed audio, and the training CLI with the flags."""

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel, causal_log_mel
from oasr.text.tokenizer import CharTokenizer
from recipes.data import FeatureSet, SpecAugmentConfig
from recipes.whisper_ctc.augment import (
    SILENCE_VALUE,
    FeatureAugmentConfig,
    apply_gain,
    augment_features,
    augmented_batch,
    band_limit,
    bin_centres_hz,
    frame_floors,
    pad_silence,
    quiet_edges,
    trim_quiet,
    warp_mel,
)
from recipes.whisper_ctc.feats import compute_split
from recipes.whisper_ctc.train import (
    UNITS,
    TrainState,
    WctcTrainConfig,
    load_checkpoint_model,
    main,
    save_checkpoint,
)

RATE = 16000


def voiced(seconds: float, f0: float, seed: int, noise: float = 0.0) -> np.ndarray:
    """A harmonic tone with a rising-falling envelope (speech-like), optional noise floor."""
    t = np.arange(int(seconds * RATE)) / RATE
    tone = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 12))
    out = 0.3 * np.sin(np.pi * t / seconds) ** 2 * tone
    out += noise * np.random.default_rng(seed).standard_normal(len(t))
    return out.astype(np.float32)


def test_warp_moves_a_spectral_peak_and_keeps_the_edges() -> None:
    feats = np.full((4, 80), -0.5, np.float32)
    feats[:, 40] = 1.0  # one band lit (about 1.8 kHz)
    assert np.array_equal(warp_mel(feats, 1.0), feats)
    up, down = warp_mel(feats, 1.12), warp_mel(feats, 0.88)
    assert int(up[0].argmax()) > 40 > int(down[0].argmax())
    ratio = bin_centres_hz(80)[int(up[0].argmax())] / bin_centres_hz(80)[40]
    assert 1.05 < ratio < 1.2
    ramp = np.tile(np.linspace(-1, 1, 80, dtype=np.float32), (2, 1))
    for alpha in (0.88, 1.12):  # the piecewise warp keeps 0 and 8 kHz in place
        warped = warp_mel(ramp, alpha)
        assert abs(warped[0, -1] - ramp[0, -1]) < 0.02
        assert np.all(np.diff(warped[0]) >= 0)


def test_leading_digital_silence_equals_the_frontend_on_zero_padded_audio() -> None:
    audio = voiced(1.0, 140.0, 0)
    feats = causal_log_mel(audio)
    lead = 25
    truth = causal_log_mel(np.concatenate([np.zeros(lead * 160, np.float32), audio]))
    ours = pad_silence(feats, lead, 0, digital=True, rng=np.random.default_rng(0))
    assert ours.shape == truth.shape
    keep = np.r_[0:lead - 1, lead:len(truth)]  # frame lead-1's window reaches the audio
    np.testing.assert_allclose(ours[keep], truth[keep], atol=1e-5)
    assert np.all(ours[:lead] == SILENCE_VALUE)


def test_trailing_digital_silence_equals_the_frontend_floor() -> None:
    audio = voiced(1.0, 200.0, 1)  # 16000 samples: 101 frames
    feats = causal_log_mel(audio)
    trail = 20
    truth = causal_log_mel(np.concatenate([audio, np.zeros(trail * 160, np.float32)]))
    ours = pad_silence(feats, 0, trail, digital=True, rng=np.random.default_rng(0))
    assert ours.shape == truth.shape
    np.testing.assert_allclose(ours[:len(feats)], truth[:len(feats)], atol=1e-5)
    # frames whose window lies wholly after the audio sit at the stream's floor
    np.testing.assert_allclose(ours[len(feats) + 1:], truth[len(feats) + 1:], atol=1e-5)
    assert np.allclose(ours[-1], frame_floors(feats)[-1])


def test_gain_equals_the_frontend_on_scaled_audio() -> None:
    audio = voiced(0.8, 170.0, 2, noise=1e-3)
    for gain_db in (-6.0, 4.5):
        truth = causal_log_mel(audio * np.float32(10 ** (gain_db / 20)))
        np.testing.assert_allclose(apply_gain(causal_log_mel(audio), gain_db), truth, atol=1e-4)


def test_band_limit_floors_the_bands_above_the_cutoff_only() -> None:
    feats = causal_log_mel(voiced(0.6, 180.0, 3, noise=1e-3))
    out = band_limit(feats, 4000.0)
    above = bin_centres_hz(80) > 4000.0
    assert 10 < above.sum() < 40
    np.testing.assert_array_equal(out[:, ~above], feats[:, ~above])
    assert np.all(out[:, above] == frame_floors(feats[:, ~above])[:, None])
    assert np.all(out[:, above] <= feats[:, above] + 1e-6)  # removing energy never adds any


def test_own_noise_silence_and_trim_keep_the_speech() -> None:
    audio = np.concatenate([np.zeros(8000, np.float32), voiced(0.7, 150.0, 4),
                            np.zeros(8000, np.float32)])
    audio += 1e-4 * np.random.default_rng(4).standard_normal(len(audio)).astype(np.float32)
    feats = causal_log_mel(audio)
    lead, trail = quiet_edges(feats)
    assert 45 <= lead <= 60 and 45 <= trail <= 62
    trimmed = trim_quiet(feats, 1000, 1000, keep=10)
    assert quiet_edges(trimmed) == (10, 10)
    np.testing.assert_array_equal(trimmed, feats[lead - 10: len(feats) - trail + 10])
    padded = pad_silence(feats, 30, 40, digital=False, rng=np.random.default_rng(0))
    assert len(padded) == len(feats) + 70
    quiet_rows = {row.tobytes() for row in feats[:lead]}
    assert all(row.tobytes() in quiet_rows for row in padded[:30])  # resampled own noise floor
    np.testing.assert_array_equal(padded[30:30 + len(feats)], feats)


def test_config_defaults_are_off_and_validated() -> None:
    cfg = FeatureAugmentConfig()
    assert not cfg.is_enabled
    feats = causal_log_mel(voiced(0.5, 150.0, 5))
    np.testing.assert_array_equal(augment_features(feats, cfg, np.random.default_rng(0)), feats)
    assert FeatureAugmentConfig(gain_prob=0.1).is_enabled
    with pytest.raises(ValueError, match="warp_prob"):
        FeatureAugmentConfig(warp_prob=1.5)
    with pytest.raises(ValueError, match="warp_min"):
        FeatureAugmentConfig(warp_min=1.2, warp_max=1.1)
    with pytest.raises(ValueError, match="band_limit_hz"):
        FeatureAugmentConfig(band_limit_hz=(3000.0, 9000.0))


def write_split(root: Path, split: str, texts: list[str]) -> None:
    rows = []
    for i, text in enumerate(texts):
        wav = root / f"{split}{i}.wav"
        audio = np.concatenate([np.zeros(3200, np.float32), voiced(0.9 + 0.2 * i, 120 + 30 * i, i),
                                np.zeros(3200, np.float32)])
        sf.write(wav, audio, RATE)
        rows.append(f"{split}{i}\t{wav}\t1.0\ttone\t{text}")
    (root / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    compute_split(root / f"{split}.tsv", root / "feats", split)


def test_augmented_batch_and_training_cli_with_the_flags(tmp_path: Path) -> None:
    texts = ["a tone", "two tones here", "three", "more tones"]
    for split in ("train", "heldout_sentences"):
        write_split(tmp_path, split, texts)
    data = FeatureSet(tmp_path / "feats", "train", CharTokenizer.from_units(UNITS).encode)
    cfg = FeatureAugmentConfig(warp_prob=1.0, band_limit_prob=1.0, gain_prob=1.0,
                               lead_silence_prob=1.0, trail_silence_prob=1.0)
    batch = augmented_batch(data, [0, 1, 2], cfg, SpecAugmentConfig(), np.zeros(80, np.float32),
                            np.random.default_rng(0))
    plain = data.make_batch([0, 1, 2], None, np.zeros(80, np.float32), np.random.default_rng(0))
    assert torch.equal(batch.targets, plain.targets)
    assert torch.all(batch.feat_lens > plain.feat_lens)  # silence added at both edges
    assert batch.num_frames == int(batch.feat_lens.sum())
    tiny = WhisperCtcModel(WhisperCtcConfig(width=64, heads=2, layers=2, max_positions=400))
    init = tmp_path / "init.pt"
    save_checkpoint(init, tiny, None, TrainState(step=77), WctcTrainConfig())
    ckpt = tmp_path / "ckpt"
    main(["--feats", str(tmp_path / "feats"), "--ckpt", str(ckpt), "--init-ckpt", str(init),
          "--max-steps", "3", "--warmup-steps", "1", "--train-layers", "-1", "--fp32",
          "--warp-prob", "0.5", "--trail-silence-prob", "0.5", "--time-masks", "3",
          "--freq-width", "12"])
    model, payload = load_checkpoint_model(ckpt / "latest.pt")
    assert payload["state"]["step"] == 3  # fresh schedule: the init checkpoint's step is not kept
    assert payload["train_config"]["augment"]["warp_prob"] == 0.5
    assert payload["train_config"]["spec"]["num_time_masks"] == 3
    assert model.config.width == 64  # the init checkpoint's architecture, not Whisper tiny.en
    assert not torch.equal(model.ctc.weight, tiny.ctc.weight)
