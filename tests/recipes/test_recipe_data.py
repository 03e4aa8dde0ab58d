"""Feature store round trip, length buckets, deterministic epochs, SpecAugment."""

from pathlib import Path

import numpy as np
import pytest

from recipes.data import FeatureSet, SpecAugmentConfig, spec_augment
from recipes.feats import FeatIndex


def write_split(feats_dir: Path, lengths: list[int]) -> list[np.ndarray]:
    """A split in the stage-3 layout whose frame values encode (utterance, frame)."""
    feats_dir.mkdir(parents=True, exist_ok=True)
    utts = [np.full((n, 80), i, np.float32) + np.arange(n)[:, None] / 1000 for i, n in
            enumerate(lengths)]
    np.save(feats_dir / "train.npy", np.concatenate(utts).astype(np.float16))
    lines, off = [], 0
    for i, u in enumerate(utts):
        lines.append(f"utt{i}\t{off}\t{len(u)}\tword{i} x")
        off += len(u)
    (feats_dir / "train.tsv").write_text("\n".join(lines) + "\n")
    return utts


def encode(text: str) -> list[int]:
    return [3 + (ord(c) % 20) for c in text.replace(" ", "")]


def test_index_and_features_round_trip(tmp_path: Path) -> None:
    utts = write_split(tmp_path, [50, 20, 90])
    index = FeatIndex.read(tmp_path / "train.tsv")
    assert index.offsets.tolist() == [0, 50, 70] and index.num_frames.tolist() == [50, 20, 90]
    fs = FeatureSet(tmp_path, "train", encode)
    for i, u in enumerate(utts):
        np.testing.assert_allclose(fs.features(i), u, atol=2e-2)


def test_pooled_splits_read_as_one_set(tmp_path: Path) -> None:
    first = write_split(tmp_path / "a", [50, 20])
    second = write_split(tmp_path / "b", [30, 90, 10])
    for name in ("npy", "tsv"):  # both splits in one folder, as train and train_digits
        (tmp_path / "b" / f"train.{name}").rename(tmp_path / "a" / f"extra.{name}")
    fs = FeatureSet(tmp_path / "a", ("train", "extra"), encode)
    assert len(fs) == 5 and fs.ids == ["utt0", "utt1", "utt0", "utt1", "utt2"]
    assert fs.lengths.tolist() == [50, 20, 30, 90, 10] and fs.offsets.tolist() == [0, 50, 70, 100, 190]
    for i, u in enumerate(first + second):
        np.testing.assert_allclose(fs.features(i), u, atol=2e-2)
    assert FeatureSet(tmp_path / "a", ("train",), encode).ids == FeatureSet(tmp_path / "a", "train", encode).ids
    with pytest.raises(ValueError, match="split"):
        FeatureSet(tmp_path / "a", (), encode)


def test_buckets_cover_everything_within_the_frame_budget(tmp_path: Path) -> None:
    lengths = [30, 200, 45, 120, 80, 80, 300, 10, 60, 150]
    write_split(tmp_path, lengths)
    fs = FeatureSet(tmp_path, "train", encode)
    groups = fs.buckets(max_frames=320)
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(len(lengths)))
    for g in groups:
        assert max(lengths[i] for i in g) * len(g) <= 320
    a = fs.epoch_batches(320, seed=5, epoch=2)
    assert a == fs.epoch_batches(320, seed=5, epoch=2)
    assert sorted(map(tuple, a)) == sorted(map(tuple, groups))


def test_make_batch_pads_features_and_targets(tmp_path: Path) -> None:
    write_split(tmp_path, [40, 25])
    fs = FeatureSet(tmp_path, "train", encode)
    batch = fs.make_batch([0, 1], None, np.zeros(80, np.float32), np.random.default_rng(0))
    assert tuple(batch.feats.shape) == (2, 40, 80)
    assert batch.feat_lens.tolist() == [40, 25] and batch.num_frames == 65
    assert float(batch.feats[1, 25:].abs().sum()) == 0.0
    assert batch.target_lens.tolist() == [len(encode("word0 x")), len(encode("word1 x"))]
    assert batch.targets[0, : batch.target_lens[0]].tolist() == encode("word0 x")


def test_spec_augment_masks_with_the_fill_value() -> None:
    feats = np.random.default_rng(1).normal(size=(200, 80)).astype(np.float32) + 5
    fill = np.full(80, -7.0, np.float32)
    cfg = SpecAugmentConfig(num_freq_masks=1, max_freq_width=10, num_time_masks=1,
                            max_time_width=20, max_time_fraction=0.5)
    out = spec_augment(feats, cfg, fill, np.random.default_rng(3))
    masked = out == -7.0
    assert masked.any(), "seeded masks of width > 0 must mask something"
    full_rows = masked.all(axis=1).sum()
    full_cols = masked.all(axis=0).sum()
    assert full_rows <= 20 and full_cols <= 10
    np.testing.assert_array_equal(out[~masked], feats[~masked])
    with pytest.raises(ValueError, match="max_time_fraction"):
        SpecAugmentConfig(max_time_fraction=1.5)
