"""Whisper-CTC training recipe: features of real synthesised speech, a few updates that lower
the loss, an atomic checkpoint that resumes at its step, the LR schedule and chunk sampling."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel, load_whisper_ctc_dir
from oasr.text.tokenizer import CharTokenizer
from recipes.data import FeatureSet, SpecAugmentConfig
from recipes.whisper_ctc.evaluate import heldout_utterances, score
from recipes.whisper_ctc.export import export
from recipes.whisper_ctc.feats import compute_split
from recipes.whisper_ctc.train import (
    UNITS,
    Paths,
    WctcTrainConfig,
    ctc_loss,
    load_checkpoint_model,
    run,
    sample_chunking,
)

SENTENCES = ("the cat sat on the mat", "open the door please", "seven green apples")
TINY = WhisperCtcConfig(width=64, heads=2, layers=2, max_positions=400)


@pytest.fixture(scope="module")
def feats_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    root = tmp_path_factory.mktemp("wctc")
    rows = []
    for i, text in enumerate(SENTENCES):
        wav = root / f"u{i}.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), text], check=True)
        subprocess.run(["sox", str(wav), "-r", "16000", str(root / f"r{i}.wav")], check=True)
        rows.append(f"u{i}\t{root / f'r{i}.wav'}\t1.0\tespeak\t{text}")
    manifest = root / "manifest.tsv"
    manifest.write_text("\n".join(rows) + "\n")
    for split in ("train", "heldout_sentences"):
        compute_split(manifest, root / "feats", split)
    return root / "feats"


def tiny_config(**overrides: object) -> WctcTrainConfig:
    base = {"max_frames": 2000, "body_lr": 3e-3, "head_lr": 3e-3, "warmup_steps": 2,
            "total_steps": 100, "num_valid_utts": 3, "bf16": False,
            "spec": SpecAugmentConfig(max_time_width=5)}
    base.update(overrides)
    return WctcTrainConfig(**base)  # type: ignore[arg-type]


def clean_loss(model: WhisperCtcModel, feats: Path) -> float:
    data = FeatureSet(feats, "train", CharTokenizer.from_units(UNITS).encode)
    batch = data.make_batch(list(range(len(data))), None, np.zeros(80, np.float32),
                            np.random.default_rng(0))
    with torch.no_grad():
        return ctc_loss(model, batch, -1, -1, bf16=False).item()


def test_features_index_points_into_the_array(feats_dir: Path) -> None:
    data = FeatureSet(feats_dir, "train", CharTokenizer.from_units(UNITS).encode)
    assert data.texts == list(SENTENCES)
    assert data.array.dtype == np.float16 and data.array.shape[1] == 80
    assert int(data.lengths.sum()) == len(data.array)
    first = data.features(0)
    assert first.min() > -1.6 and first.max() < 2.5  # (log10 + 4) / 4 scale


def test_parallel_features_equal_serial(feats_dir: Path, tmp_path: Path) -> None:
    manifest = feats_dir.parent / "manifest.tsv"
    frames = compute_split(manifest, tmp_path, "train", num_workers=2)
    assert frames == len(np.load(feats_dir / "train.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "train.npy"), np.load(feats_dir / "train.npy"))
    assert (tmp_path / "train.tsv").read_text() == (feats_dir / "train.tsv").read_text()


def test_training_lowers_the_loss_and_resumes(feats_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = WhisperCtcModel(TINY)
    before = clean_loss(model, feats_dir)
    paths = Paths(feats_dir, tmp_path / "ckpt")
    state = run(paths, tiny_config(), model=model, max_steps=12)
    assert state.step == 12
    trained, payload = load_checkpoint_model(paths.ckpt / "latest.pt")
    assert payload["state"]["step"] == 12 and "optimizer" in payload
    after = clean_loss(trained, feats_dir)
    assert after < 0.8 * before, (before, after)
    resumed = run(paths, tiny_config(), model=WhisperCtcModel(TINY), max_steps=14)
    assert resumed.step == 14  # continued from 12, not from a fresh model at 0
    assert resumed.audio_seconds > state.audio_seconds
    assert (paths.ckpt / "best.pt").exists()
    assert len((paths.ckpt / "history.jsonl").read_text().splitlines()) == 2
    size = export(paths.ckpt / "latest.pt", tmp_path / "export")
    exported = load_whisper_ctc_dir(tmp_path / "export")
    assert size == (tmp_path / "export" / "model.safetensors").stat().st_size
    assert exported.config == TINY
    utts = heldout_utterances(feats_dir, "heldout_sentences", 10)
    full, chunked = score(exported, utts, -1), score(exported, utts, 32, beam=3)
    assert full.utterances == chunked.utterances == len(SENTENCES)
    assert full.words == sum(len(t.split()) for t in SENTENCES)


def test_lr_schedule_and_chunk_sampling() -> None:
    cfg = WctcTrainConfig(warmup_steps=10, total_steps=110, final_lr_ratio=0.1)
    assert cfg.lr_scale(0) == pytest.approx(0.1) and cfg.lr_scale(9) == pytest.approx(1.0)
    assert cfg.lr_scale(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert cfg.lr_scale(10_000) == pytest.approx(0.1)
    rng = np.random.default_rng(0)
    draws = [sample_chunking(cfg, rng) for _ in range(2000)]
    chunks = [c for c, _ in draws]
    assert set(chunks) == {-1, 8, 16, 32, 64}
    assert 0.15 < chunks.count(-1) / len(chunks) < 0.25
    assert chunks.count(32) > chunks.count(16)
    lefts = [left for c, left in draws if c > 0]
    assert 0.75 < lefts.count(-1) / len(lefts) < 0.95 and max(lefts) <= 8
    with pytest.raises(ValueError, match="warmup_steps"):
        WctcTrainConfig(warmup_steps=200, total_steps=100)
