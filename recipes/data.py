"""Training batches from the stored features: length buckets, SpecAugment, CTC targets.

The whole float16 feature array of a split is read into memory once (about 0.6 GB for 10 hours
of audio); a batch is a run of utterances of similar length whose padded size stays under
``max_frames``. The batch order of an epoch depends only on (seed, epoch), so a resumed run
continues with exactly the batches it had not seen yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from recipes.feats import FeatIndex


@dataclass(frozen=True)
class Batch:
    """One padded training batch."""

    feats: Tensor  # (B, T, 80) float32 raw fbank
    feat_lens: Tensor  # (B,) int64
    targets: Tensor  # (B, U) int64 token ids, padded with 0 past target_lens
    target_lens: Tensor  # (B,) int64
    num_frames: int  # real (unpadded) fbank frames

    @property
    def audio_seconds(self) -> float:
        return self.num_frames / 100.0


@dataclass(frozen=True)
class SpecAugmentConfig:
    """Frequency and time masking (masked values are set to the CMVN mean, i.e. 0 after CMVN)."""

    num_freq_masks: int = 2
    max_freq_width: int = 10
    num_time_masks: int = 2
    max_time_width: int = 40
    max_time_fraction: float = 0.15  # a time mask covers at most this share of the utterance

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_time_fraction <= 1.0:
            raise ValueError(f"max_time_fraction must be in [0, 1], got {self.max_time_fraction}")


class FeatureSet:
    """One split's features + token ids, ready to batch.

    Args:
        feats_dir: folder holding ``<split>.npy`` / ``<split>.tsv``.
        split: split name, or several whose utterances are pooled into one set.
        encode: text -> token ids.
        max_utt_frames: utterances longer than this are left out.
    """

    def __init__(self, feats_dir: Path, split: str | tuple[str, ...], encode,
                 max_utt_frames: int = 3000) -> None:
        splits = (split,) if isinstance(split, str) else tuple(split)
        if not splits:
            raise ValueError("need at least one split")
        index, arrays = FeatIndex.read(feats_dir / f"{splits[0]}.tsv"), []
        for k, name in enumerate(splits):
            arrays.append(np.load(feats_dir / f"{name}.npy"))  # (N, 80) float16, in memory
            if k:
                index = index.extend(FeatIndex.read(feats_dir / f"{name}.tsv"),
                                     sum(len(a) for a in arrays[:-1]))
        self.array = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        keep = [i for i, n in enumerate(index.num_frames) if 8 <= n <= max_utt_frames]
        self.ids = [index.ids[i] for i in keep]
        self.texts = [index.texts[i] for i in keep]
        self.offsets = index.offsets[keep]
        self.lengths = index.num_frames[keep]
        self.tokens = [np.asarray(encode(t), dtype=np.int64) for t in self.texts]

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def total_hours(self) -> float:
        return float(self.lengths.sum()) / 360000.0

    def features(self, i: int) -> np.ndarray:
        """(T, 80) float32 features of utterance ``i``."""
        off, n = int(self.offsets[i]), int(self.lengths[i])
        return self.array[off:off + n].astype(np.float32)

    def buckets(self, max_frames: int, subset: list[int] | None = None) -> list[list[int]]:
        """Utterance indices (all, or ``subset``) grouped by length, padded size <= ``max_frames``."""
        pool = np.arange(len(self.ids)) if subset is None else np.asarray(subset, dtype=np.int64)
        order = pool[np.argsort(self.lengths[pool], kind="stable")]
        groups: list[list[int]] = []
        current: list[int] = []
        for i in order:
            longest = int(self.lengths[i])  # sorted ascending: the newcomer is the longest
            if current and longest * (len(current) + 1) > max_frames:
                groups.append(current)
                current = []
            current.append(int(i))
        if current:
            groups.append(current)
        return groups

    def epoch_batches(self, max_frames: int, seed: int, epoch: int) -> list[list[int]]:
        """This epoch's batches in a shuffled order fixed by (seed, epoch)."""
        groups = self.buckets(max_frames)
        rng = np.random.default_rng([seed, epoch])
        return [groups[k] for k in rng.permutation(len(groups))]

    def make_batch(self, indices: list[int], spec: SpecAugmentConfig | None,
                   fill: np.ndarray, rng: np.random.Generator) -> Batch:
        """Pad utterances ``indices`` into a batch, SpecAugment each when ``spec`` is given.

        ``fill``: (80,) value written into masked regions (the CMVN mean).
        """
        feats = [self.features(i) for i in indices]
        if spec is not None:
            feats = [spec_augment(f, spec, fill, rng) for f in feats]
        return collate(feats, [self.tokens[i] for i in indices])


def collate(feats: list[np.ndarray], tokens: list) -> Batch:
    """Zero-pad (T_b, F) features and token sequences into a `Batch`."""
    lens = [len(f) for f in feats]
    padded = np.zeros((len(feats), max(lens), feats[0].shape[1]), dtype=np.float32)
    for b, f in enumerate(feats):
        padded[b, : len(f)] = f
    targets = np.zeros((len(tokens), max(len(t) for t in tokens)), dtype=np.int64)
    for b, t in enumerate(tokens):
        targets[b, : len(t)] = t
    return Batch(
        feats=torch.from_numpy(padded),
        feat_lens=torch.tensor(lens, dtype=torch.int64),
        targets=torch.from_numpy(targets),
        target_lens=torch.tensor([len(t) for t in tokens], dtype=torch.int64),
        num_frames=sum(lens),
    )


def spec_augment(feats: np.ndarray, cfg: SpecAugmentConfig, fill: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
    """Mask random frequency bands and time spans of (T, F) ``feats`` (a copy is returned)."""
    out = feats.copy()
    num_frames, num_bins = out.shape
    for _ in range(cfg.num_freq_masks):
        width = int(rng.integers(0, cfg.max_freq_width + 1))
        start = int(rng.integers(0, max(num_bins - width, 1)))
        out[:, start:start + width] = fill[start:start + width]
    max_width = min(cfg.max_time_width, int(num_frames * cfg.max_time_fraction))
    for _ in range(cfg.num_time_masks):
        width = int(rng.integers(0, max_width + 1))
        start = int(rng.integers(0, max(num_frames - width, 1)))
        out[start:start + width] = fill
    return out
