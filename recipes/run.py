"""The whole recipe in one command: text -> synth -> feats -> train -> evaluate -> export.

    nice -n 10 python -m recipes.run                       # everything, resuming what exists
    python -m recipes.run --stages evaluate,export         # just score and export the best ckpt
    python -m recipes.run --train-hours 1.5                # bound this run's training time
    python -m recipes.run --model-out oasr/assets/default_model   # replace the bundled model

This is the Conformer-CTC recipe; the bundled default is now Whisper-CTC (``recipes.wctc_run``).
``--model-out`` defaults to ``<data>/export``, outside the repository, so a run never overwrites
the bundled model unless asked to.

Every stage resumes: text is rebuilt only when missing, synthesis skips finished wavs, features
skip finished splits, training resumes from ``<data>/ckpt/latest.pt``. Each stage's wall time is
printed and appended to ``<data>/logs/stages.tsv``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

STAGES = ("text", "synth", "feats", "train", "evaluate", "export")


def run_stage(name: str, args: argparse.Namespace) -> None:
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
    elif name == "feats":
        from recipes.feats import compute_features

        print("frames per split:", compute_features(data, args.workers))
    elif name == "train":
        from recipes.train import TrainConfig, run

        run(data, data / "ckpt", TrainConfig(total_steps=args.total_steps), args.train_hours)
    elif name == "evaluate":
        _evaluate(args)
    elif name == "export":
        from recipes.export import export

        size = export(data / "ckpt" / "best.pt", args.model_out, data / "eval" / "best.json")
        print(f"exported to {args.model_out} ({size / 1e6:.2f} MB weights)")


def _evaluate(args: argparse.Namespace) -> None:
    import json

    from recipes.evaluate import evaluate, markdown_table

    report = evaluate(args.data / "ckpt" / "best.pt", args.audio_root / "devset",
                      args.data / "feats", heldout_limit=300)
    out = args.data / "eval" / "best.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(markdown_table(report))


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/data"))
    parser.add_argument("--audio-root", type=Path, default=Path("/work/shared/audio"))
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--num-train", type=int, default=10000, help="train utterances")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--train-hours", type=float, default=2.0, help="<= 0: until killed")
    parser.add_argument("--total-steps", type=int, default=20000)
    parser.add_argument("--model-out", type=Path, default=None,
                        help="default <data>/export; oasr/assets/default_model replaces the bundled one")
    args = parser.parse_args(argv)
    if args.model_out is None:
        args.model_out = args.data / "export"
    run_stages(parse_stages(args.stages, STAGES), lambda name: run_stage(name, args),
               args.data / "logs")


if __name__ == "__main__":
    main()
