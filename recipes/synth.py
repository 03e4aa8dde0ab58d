"""Stage 2: synthesise the corpus (16 kHz mono 16-bit wavs) and write the manifests.

Plan first (deterministic from the seed, saved to ``<data>/plan.jsonl``), then speak it with a
small process pool, one task = up to ``task_size`` utterances of one engine (so piper / hibari
load their model once per task and festival runs one batch). Finished wavs are never redone, so
the stage resumes where a killed run stopped. Manifests: ``<data>/manifests/<split>.tsv`` with
columns ``id  path  seconds  voice  text``.

Splits: ``train`` (training voices, augmented), ``heldout_sentences`` (unseen sentences,
training voices, clean) and ``heldout_voices`` (unseen sentences, held-out voices, clean).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from recipes.augment import SAMPLE_RATE, AugmentPlan, apply_augment, draw_plan
from recipes.paths import DATA_ROOT
from recipes.voices import SynthRequest, Voice, sample_voice, synthesize_batch


@dataclass(frozen=True)
class SynthConfig:
    """Corpus size and process settings."""

    num_train_utterances: int = 8000
    pair_probability: float = 0.3  # a train utterance joins two sentences
    task_size: int = 40
    num_workers: int = 2
    seed: int = 4321

    def __post_init__(self) -> None:
        if self.num_train_utterances < 1 or self.num_workers < 1 or self.task_size < 1:
            raise ValueError(f"sizes must be >= 1, got {self}")


@dataclass(frozen=True)
class Item:
    """One planned utterance."""

    id: str
    split: str
    text: str
    voice: Voice
    augment: AugmentPlan
    seed: int

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "split": self.split, "text": self.text,
                           "voice": self.voice.__dict__, "augment": self.augment.to_dict(),
                           "seed": self.seed})

    @staticmethod
    def from_json(line: str) -> Item:
        d = json.loads(line)
        return Item(d["id"], d["split"], d["text"], Voice(**d["voice"]),
                    AugmentPlan(**d["augment"]), d["seed"])


def plan_items(text_dir: Path, cfg: SynthConfig) -> list[Item]:
    """Every utterance of every split, with its voice and augmentation drawn from the seed."""
    rng = random.Random(cfg.seed)
    items: list[Item] = []
    for split in ("heldout_sentences", "heldout_voices"):
        for i, text in enumerate(_read_lines(text_dir / f"{split}.txt")):
            voice = sample_voice(rng, heldout=split == "heldout_voices")
            items.append(Item(f"{split}-{i:05d}", split, text, voice, draw_plan(rng, False),
                              rng.randrange(2**31)))
    sentences = _read_lines(text_dir / "train.txt")
    pos = 0
    for i in range(cfg.num_train_utterances):
        if pos >= len(sentences):
            raise ValueError(f"train text ran out after {i} utterances ({len(sentences)} lines)")
        text = sentences[pos]
        pos += 1
        if rng.random() < cfg.pair_probability and pos < len(sentences):
            text, pos = f"{text} {sentences[pos]}", pos + 1
        items.append(Item(f"train-{i:06d}", "train", text, sample_voice(rng, heldout=False),
                          draw_plan(rng, True), rng.randrange(2**31)))
    return items


def _read_lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def wav_path(data: Path, item: Item) -> Path:
    return data / "wav" / item.split / f"{item.id}.wav"


def make_tasks(items: list[Item], task_size: int) -> list[list[Item]]:
    """Group items by engine into tasks of at most ``task_size``; engines interleaved."""
    by_engine: dict[str, list[Item]] = {}
    for item in items:
        by_engine.setdefault(item.voice.engine, []).append(item)
    per_engine = [[group[i:i + task_size] for i in range(0, len(group), task_size)]
                  for group in by_engine.values()]
    tasks: list[list[Item]] = []
    for round_ in range(max(len(t) for t in per_engine)):
        tasks.extend(t[round_] for t in per_engine if round_ < len(t))
    return tasks


def run_task(args: tuple[Path, list[Item]]) -> tuple[int, float]:
    """Synthesise the missing wavs of one task; returns (files written, audio seconds)."""
    data, items = args
    todo = [it for it in items if not wav_path(data, it).exists()]
    if not todo:
        return 0, 0.0
    seconds = 0.0
    with tempfile.TemporaryDirectory(prefix="oasr-synth-") as tmp_name:
        tmp = Path(tmp_name)
        requests = [SynthRequest(it.voice, it.text, it.seed) for it in todo]
        for item, audio in zip(todo, synthesize_batch(requests, tmp), strict=True):
            out = apply_augment(audio.samples, audio.sample_rate, item.augment, item.seed, tmp)
            seconds += write_wav(wav_path(data, item), out)
    return len(todo), seconds


def write_wav(path: Path, samples: np.ndarray) -> float:
    """Write (N,) float ``samples`` as 16 kHz 16-bit ``path`` through a temporary name (a killed
    run never leaves a partial file under the final name); returns the seconds written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part.wav")
    sf.write(str(partial), samples, SAMPLE_RATE, subtype="PCM_16")
    partial.rename(path)
    return len(samples) / SAMPLE_RATE


def write_manifests(data: Path, items: list[Item]) -> dict[str, tuple[int, float]]:
    """``<data>/manifests/<split>.tsv`` for the wavs that exist; returns (count, hours)."""
    out_dir = data / "manifests"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[str]] = {}
    totals: dict[str, tuple[int, float]] = {}
    for item in items:
        path = wav_path(data, item)
        if not path.exists():
            continue
        secs = sf.info(str(path)).duration
        rows.setdefault(item.split, []).append(
            f"{item.id}\t{path}\t{secs:.3f}\t{item.voice.name}\t{item.text}")
        n, h = totals.get(item.split, (0, 0.0))
        totals[item.split] = (n + 1, h + secs / 3600)
    for split, lines in rows.items():
        (out_dir / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return totals


def synthesize_corpus(data: Path, cfg: SynthConfig) -> dict[str, tuple[int, float]]:
    """Plan (or reload the plan), synthesise what is missing, write manifests."""
    plan_file = data / "plan.jsonl"
    if plan_file.exists():
        items = [Item.from_json(ln) for ln in plan_file.read_text().splitlines() if ln]
    else:
        items = plan_items(data / "text", cfg)
        plan_file.write_text("\n".join(it.to_json() for it in items) + "\n")
    tasks = make_tasks(items, cfg.task_size)
    start, done, secs = time.time(), 0, 0.0
    with mp.get_context("spawn").Pool(cfg.num_workers) as pool:
        for k, (n, s) in enumerate(pool.imap_unordered(run_task, [(data, t) for t in tasks])):
            done, secs = done + n, secs + s
            if k % 10 == 0 or k == len(tasks) - 1:
                rate = secs / max(time.time() - start, 1e-6)
                print(f"task {k + 1}/{len(tasks)}: {done} new files, {secs / 3600:.2f} h "
                      f"({rate:.1f} audio-s/s)", flush=True)
    return write_manifests(data, items)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--num-train", type=int, default=SynthConfig.num_train_utterances)
    parser.add_argument("--workers", type=int, default=SynthConfig.num_workers)
    args = parser.parse_args(argv)
    cfg = SynthConfig(num_train_utterances=args.num_train, num_workers=args.workers)
    for split, (n, hours) in synthesize_corpus(args.data, cfg).items():
        print(f"{split}: {n} files, {hours:.2f} h")


if __name__ == "__main__":
    main()
