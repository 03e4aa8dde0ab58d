"""The whole recipe in one command: text -> synth -> feats -> train -> evaluate -> export.

    nice -n 10 python -m recipes.conformer.run                 # everything, resuming what exists
    python -m recipes.conformer.run --stages evaluate,export   # just score and export the best ckpt
    python -m recipes.conformer.run --train-hours 1.5          # bound this run's training time
    python -m recipes.conformer.run --model-out oasr/assets/default_model  # replace the bundled one

This is the Conformer-CTC recipe; the bundled default is now Whisper-CTC
(``recipes.whisper_ctc.run``).
``--model-out`` defaults to ``<data>/export``, outside the repository, so a run never overwrites
the bundled model unless asked to.

Every stage resumes: text is rebuilt only when missing, synthesis skips finished wavs, features
skip finished splits, training resumes from ``<data>/ckpt/latest.pt``. Each stage's wall time is
printed and appended to ``<data>/logs/stages.tsv``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recipes.paths import DATA_ROOT
from recipes.stages import DATA_STAGES, parse_stages, run_data_stage, run_stages
from recipes.text import TEST_AUDIO_ROOT

STAGES = ("text", "synth", "feats", "train", "evaluate", "export")


def run_stage(name: str, args: argparse.Namespace) -> None:
    data = args.data
    if name in DATA_STAGES:
        run_data_stage(name, args)
    elif name == "feats":
        from recipes.feats import compute_features

        print("frames per split:", compute_features(data, args.workers))
    elif name == "train":
        from recipes.conformer.train import TrainConfig, run

        run(data, data / "ckpt", TrainConfig(total_steps=args.total_steps), args.train_hours)
    elif name == "evaluate":
        _evaluate(args)
    elif name == "export":
        from recipes.conformer.export import export

        size = export(data / "ckpt" / "best.pt", args.model_out, data / "eval" / "best.json")
        print(f"exported to {args.model_out} ({size / 1e6:.2f} MB weights)")


def _evaluate(args: argparse.Namespace) -> None:
    import json

    from recipes.conformer.evaluate import evaluate, markdown_table

    report = evaluate(args.data / "ckpt" / "best.pt", args.audio_root / "devset",
                      args.data / "feats", heldout_limit=300)
    out = args.data / "eval" / "best.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(markdown_table(report))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--audio-root", type=Path, default=TEST_AUDIO_ROOT)
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
