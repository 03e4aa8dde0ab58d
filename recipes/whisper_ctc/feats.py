"""Whisper-CTC features: the causal log-mel (``oasr.models.whisper_ctc.causal_log_mel``) of
every utterance of the synthesis manifests, computed once and stored as float16.

Per split, in the layout ``recipes.feats`` uses for fbank (so ``recipes.data.FeatureSet``
reads it): ``<out>/<split>.npy`` (total_frames, 80) float16 back to back, and
``<out>/<split>.tsv`` (``id  offset  num_frames  text``). A split whose ``.tsv`` exists is
skipped (delete it to recompute). No CMVN: the log-mel is already normalised to about [-1, 1].
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from oasr.models.whisper_ctc.frontend import causal_log_mel
from recipes.feats import SPLITS, read_manifest
from recipes.paths import DATA_ROOT

DEFAULT_OUT = DATA_ROOT / "wctc/feats"


def log_mel_of(path: str) -> np.ndarray:
    """(T, 80) float32 causal log-mel of a 16 kHz mono wav."""
    samples, rate = sf.read(path, dtype="float32")
    if rate != 16000 or samples.ndim != 1:
        raise ValueError(f"{path}: need 16 kHz mono, got {rate} Hz with shape {samples.shape}")
    return causal_log_mel(samples)


def _half_log_mel(path: str) -> np.ndarray:
    return log_mel_of(path).astype(np.float16)


def compute_split(manifest: Path, out_dir: Path, split: str, num_workers: int = 1) -> int:
    """Write one split's features and index (``num_workers`` processes compute them); returns
    its number of frames."""
    rows = read_manifest(manifest)
    wavs = [wav for _, wav, _ in rows]
    if num_workers > 1:
        with mp.get_context("spawn").Pool(num_workers) as pool:
            feats = pool.map(_half_log_mel, wavs, chunksize=32)
    else:
        feats = [_half_log_mel(wav) for wav in wavs]
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / f"{split}.npy", np.concatenate(feats, axis=0))
    lines, offset = [], 0
    for (uid, _, text), f in zip(rows, feats, strict=True):
        lines.append(f"{uid}\t{offset}\t{len(f)}\t{text}")
        offset += len(f)
    tmp = out_dir / f"{split}.tsv.part"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.rename(out_dir / f"{split}.tsv")  # the index appears last: its presence means "done"
    return offset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--splits", nargs="+", default=list(SPLITS),
                        help="manifests to featurize (e.g. add train_digits)")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    for split in args.splits:
        if (args.out / f"{split}.tsv").exists():
            print(f"{split}: present, skipped", flush=True)
            continue
        t0 = time.time()
        frames = compute_split(args.data / "manifests" / f"{split}.tsv", args.out, split,
                               args.workers)
        secs = time.time() - t0
        print(f"{split}: {frames} frames ({frames / 360000:.2f} h) in {secs:.0f} s "
              f"({frames / 100 / secs:.0f} audio-s/s)", flush=True)


if __name__ == "__main__":
    main()
