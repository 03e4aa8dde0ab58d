"""The whole recipe in one command: text -> synth -> feats -> train -> evaluate -> export.

    nice -n 10 python -m recipes.run                       # everything, resuming what exists
    python -m recipes.run --stages evaluate,export         # just score and export the best ckpt
    python -m recipes.run --train-hours 1.5                # bound this run's training time

Every stage resumes: text is rebuilt only when missing, synthesis skips finished wavs, features
skip finished splits, training resumes from ``<data>/ckpt/latest.pt``. Each stage's wall time is
printed and appended to ``<data>/logs/stages.tsv``.
"""

from __future__ import annotations

import argparse
import time
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


def main(argv: list[str] | None = None) -> None:
    from oasr.models.checkpoint import DEFAULT_MODEL_DIR

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/data"))
    parser.add_argument("--audio-root", type=Path, default=Path("/work/shared/audio"))
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--num-train", type=int, default=10000, help="train utterances")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--train-hours", type=float, default=2.0, help="<= 0: until killed")
    parser.add_argument("--total-steps", type=int, default=20000)
    parser.add_argument("--model-out", type=Path, default=DEFAULT_MODEL_DIR)
    args = parser.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise SystemExit(f"unknown stages {unknown}; choose from {list(STAGES)}")
    (args.data / "logs").mkdir(parents=True, exist_ok=True)
    timings = []
    for name in stages:
        start = time.time()
        print(f"== stage {name} ==", flush=True)
        run_stage(name, args)
        took = time.time() - start
        timings.append((name, took))
        print(f"== stage {name} took {took / 60:.1f} min ==", flush=True)
        with open(args.data / "logs" / "stages.tsv", "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')}\t{name}\t{took:.1f}\n")
    print("stage timings: " + ", ".join(f"{n} {t / 60:.1f} min" for n, t in timings))


if __name__ == "__main__":
    main()
