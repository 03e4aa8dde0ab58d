"""Stages shared by both recipes: the data stages (text, synth) and the loop that runs and
times a list of stages into ``<data>/logs/stages.tsv``."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

DATA_STAGES = ("text", "synth")


def run_data_stage(name: str, args: argparse.Namespace) -> None:
    """``text``: the sentences, rebuilt only when missing; ``synth``: the speech, skipping
    finished wavs. Reads ``args.data``, ``args.audio_root``, ``args.num_train``,
    ``args.workers``."""
    data = args.data
    if name == "text":
        from recipes.text import TextConfig, write_text

        if not (data / "text" / "train.txt").exists():
            print("sentences per split:", write_text(data / "text", TextConfig(), args.audio_root))
    elif name == "synth":
        from recipes.synth import SynthConfig, synthesize_corpus

        cfg = SynthConfig(num_train_utterances=args.num_train, num_workers=args.workers)
        for split, (n, hours) in synthesize_corpus(data, cfg).items():
            print(f"{split}: {n} files, {hours:.2f} h")
    else:
        raise ValueError(f"{name!r} is not a data stage; choose from {DATA_STAGES}")


def parse_stages(text: str, allowed: Sequence[str]) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]`` in the given order; SystemExit naming unknown or no stages."""
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in allowed]
    if unknown:
        raise SystemExit(f"unknown stages {unknown}; choose from {list(allowed)}")
    if not stages:
        raise SystemExit(f"no stages in {text!r}; choose from {list(allowed)}")
    return stages


def stage_line(name: str, seconds: float, when: float | None = None) -> str:
    """One ``stages.tsv`` row: local time, stage name, wall seconds (one decimal), newline."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
    return f"{stamp}\t{name}\t{seconds:.1f}\n"


def run_stages(stages: Sequence[str], run_one: Callable[[str], None],
               logs: Path) -> list[tuple[str, float]]:
    """Run each stage in order, print its wall time and append it to ``logs/stages.tsv``.

    Returns:
        (stage, seconds) per stage run. A stage that raises stops the loop (nothing logged for it).
    """
    logs.mkdir(parents=True, exist_ok=True)
    timings = []
    for name in stages:
        start = time.time()
        print(f"== stage {name} ==", flush=True)
        run_one(name)
        took = time.time() - start
        timings.append((name, took))
        print(f"== stage {name} took {took / 60:.1f} min ==", flush=True)
        with open(logs / "stages.tsv", "a", encoding="utf-8") as f:
            f.write(stage_line(name, took))
    print("stage timings: " + ", ".join(f"{n} {t / 60:.1f} min" for n, t in timings), flush=True)
    return timings
