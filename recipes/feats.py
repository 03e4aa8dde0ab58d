"""Stage 3: fbank features, computed once, stored compactly, plus global CMVN statistics.

Features are exactly the serving front end's (``oasr.audio.fbank.compute_fbank``: 80-bin Kaldi
fbank, 25/10 ms, povey, dither 0, energy floor 0, snip_edges, int16-range samples). Per split:

- ``<data>/feats/<split>.npy``: (total_frames, 80) float16, every utterance back to back;
- ``<data>/feats/<split>.tsv``: ``id  offset  num_frames  text`` (offset in frames);
- ``<data>/feats/global_cmvn.json`` (train only): WeNet JSON stats (``mean_stat``, ``var_stat``,
  ``frame_num``), readable by ``oasr.models.cmvn.load_cmvn``.

A split whose ``.tsv`` exists is skipped (delete it to recompute).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from oasr.audio.fbank import compute_fbank
from recipes.paths import DATA_ROOT

SPLITS = ("train", "heldout_sentences", "heldout_voices")


@dataclass(frozen=True)
class FeatIndex:
    """Where each utterance of one split lives in its feature array."""

    ids: list[str]
    offsets: np.ndarray  # (U,) int64 frame offsets
    num_frames: np.ndarray  # (U,) int64
    texts: list[str]

    @staticmethod
    def read(path: Path) -> FeatIndex:
        ids, offs, lens, texts = [], [], [], []
        for line in path.read_text(encoding="utf-8").splitlines():
            uid, off, n, text = line.split("\t")
            ids.append(uid)
            offs.append(int(off))
            lens.append(int(n))
            texts.append(text)
        return FeatIndex(ids, np.array(offs, np.int64), np.array(lens, np.int64), texts)

    def extend(self, other: FeatIndex, shift: int) -> FeatIndex:
        """This index followed by ``other``, whose frames start ``shift`` frames into the
        joined array."""
        return FeatIndex(self.ids + other.ids, np.concatenate([self.offsets, other.offsets + shift]),
                         np.concatenate([self.num_frames, other.num_frames]),
                         self.texts + other.texts)


def _fbank_of(path: str) -> np.ndarray:
    samples, rate = sf.read(path, dtype="float32")
    if rate != 16000 or samples.ndim != 1:
        raise ValueError(f"{path}: need 16 kHz mono, got {rate} Hz with shape {samples.shape}")
    return compute_fbank(samples)  # (T, 80) float32


def read_manifest(path: Path) -> list[tuple[str, str, str]]:
    """(id, wav path, text) rows of a synthesis manifest."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        uid, wav, _secs, _voice, text = line.split("\t")
        rows.append((uid, wav, text))
    return rows


def compute_split(data: Path, split: str, num_workers: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Write one split's features; returns (sum (80,), sum of squares (80,), frames) in float64."""
    rows = read_manifest(data / "manifests" / f"{split}.tsv")
    out_dir = data / "feats"
    out_dir.mkdir(parents=True, exist_ok=True)
    with mp.get_context("spawn").Pool(num_workers) as pool:
        feats = pool.map(_fbank_of, [wav for _, wav, _ in rows], chunksize=32)
    total = sum(len(f) for f in feats)
    array = np.lib.format.open_memmap(out_dir / f"{split}.npy", mode="w+", dtype=np.float16,
                                      shape=(total, 80))
    sums, squares = np.zeros(80), np.zeros(80)
    lines, offset = [], 0
    for (uid, _, text), f in zip(rows, feats, strict=True):
        array[offset:offset + len(f)] = f.astype(np.float16)
        sums += f.sum(axis=0, dtype=np.float64)
        squares += (f.astype(np.float64) ** 2).sum(axis=0)
        lines.append(f"{uid}\t{offset}\t{len(f)}\t{text}")
        offset += len(f)
    array.flush()
    del array
    tmp = out_dir / f"{split}.tsv.part"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.rename(out_dir / f"{split}.tsv")  # the index appears last: its presence means "done"
    return sums, squares, total


def compute_features(data: Path, num_workers: int = 2) -> dict[str, int]:
    """Features of every split (skipping finished ones) and train CMVN; frames per split."""
    done: dict[str, int] = {}
    for split in SPLITS:
        index = data / "feats" / f"{split}.tsv"
        if index.exists():
            done[split] = int(FeatIndex.read(index).num_frames.sum())
            continue
        sums, squares, total = compute_split(data, split, num_workers)
        done[split] = total
        if split == "train":
            stats = {"mean_stat": sums.tolist(), "var_stat": squares.tolist(), "frame_num": total}
            (data / "feats" / "global_cmvn.json").write_text(json.dumps(stats))
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    for split, frames in compute_features(args.data, args.workers).items():
        print(f"{split}: {frames} frames ({frames / 360000:.2f} h)")


if __name__ == "__main__":
    main()
