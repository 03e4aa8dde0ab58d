"""The bundled default model (Whisper-CTC, round 5) rebuilt end to end by one command.

    nice -n 10 python -m recipes.whisper_ctc.run                       # everything, resuming
    python -m recipes.whisper_ctc.run --stages lm,evaluate,export      # the LMs, scores, export
    python -m recipes.whisper_ctc.run --out oasr/assets/default_model  # replace the bundled model

Stages: text -> synth (10,000 train utterances) -> digits (``train_digits``) -> feats (causal
log-mel into ``<data>/wctc/feats_s5``) -> train (three rounds, below) -> lm (char 7-gram + word
LM into ``<data>/lm/wctc_run``) -> evaluate (chunk-32 greedy, beam 16 + both LMs, chunk-boundary
offsets) -> export (``--out``, default ``<data>/wctc/export``, outside the repository).

The default's lineage as three training rounds (`ROUNDS`), each in its own checkpoint dir under
``<data>/wctc``, each starting from the previous round's ``final.pt``:
top-2 (Whisper tiny.en's weights, top 2 blocks fine-tuned on ``train``) -> s3 (+ feature-space
augmentation) -> s5d (``train`` + ``train_digits``, lower blocks distilled). A round resumes its
dir's ``latest.pt``; when its ``--max-hours`` (or step bound) ends it, ``latest.pt`` is copied to
``final.pt``, and a round whose ``final.pt`` exists is skipped. Each stage's wall time is printed
and appended to ``<data>/logs/stages.tsv``.

Differences from the original runs (their commands: ``<data>/wctc/logs/train_{s3,s5d}.cmd``):
all three rounds read ``feats_s5``, so top-2 and s3 see the 10,000-utterance ``train`` split
instead of the first 5,500; top-2 stops at its adopted step (4,114) instead of being killed
there; s5d's 1.45 h is the wall time of its two launches together (0.93 h each).
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recipes.paths import DATA_ROOT
from recipes.stages import DATA_STAGES, parse_stages, run_data_stage, run_stages
from recipes.text import TEST_AUDIO_ROOT

STAGES = ("text", "synth", "digits", "feats", "train", "lm", "evaluate", "export")
FEAT_SPLITS = ("train", "train_digits", "heldout_sentences", "heldout_voices")
NUM_TRAIN_UTTERANCES = 10000
WORKERS = 2
# round 3's augmentation, kept in round 5 (train_s3.cmd / train_s5d.cmd)
AUGMENT_FLAGS = (
    "--snapshot-interval-s", "900",
    "--freq-masks", "2", "--freq-width", "15", "--time-masks", "3", "--time-width", "40",
    "--warp-prob", "0.7", "--warp-range", "0.88", "1.12", "--band-limit-prob", "0.15",
    "--gain-prob", "0.5", "--max-gain-db", "6",
    "--lead-silence-prob", "0.3", "--trail-silence-prob", "0.3", "--max-silence-frames", "60",
    "--trim-prob", "0.3")
CONTINUE_FLAGS = ("--train-layers", "2", "--freeze-stem", "--body-lr", "1e-4", "--head-lr", "1e-3",
                  "--warmup-steps", "100", "--total-steps", "5000")


@dataclass(frozen=True)
class Round:
    """One training round of the default's lineage.

    ``init_from``: the round whose ``final.pt`` gives the starting weights (None: Whisper's).
    ``flags``: ``recipes.whisper_ctc.train`` flags beyond paths, splits, init and bounds.
    ``max_hours`` bounds each launch's wall time; ``max_steps`` (> 0) stops at a total step.
    """

    name: str
    init_from: str | None
    train_splits: tuple[str, ...]
    flags: tuple[str, ...]
    max_hours: float
    max_steps: int = 0

    def __post_init__(self) -> None:
        if self.max_hours <= 0:
            raise ValueError(f"round {self.name}: max_hours {self.max_hours} must be > 0 "
                             "(every round is bounded)")
        if self.max_steps < 0:
            raise ValueError(f"round {self.name}: max_steps {self.max_steps} must be >= 0")
        if not self.train_splits:
            raise ValueError(f"round {self.name}: no train splits")


ROUNDS = (
    # from Whisper, top 2 blocks: docs/model.md; adopted at step 4,114 (0.75 h of training)
    Round("top2", None, ("train",), ("--train-layers", "2", "--freeze-stem",
                                     "--total-steps", "4000"), max_hours=0.8, max_steps=4114),
    Round("s3", "top2", ("train",), CONTINUE_FLAGS + AUGMENT_FLAGS, max_hours=1.1),
    Round("s5d", "s3", ("train", "train_digits"),
          CONTINUE_FLAGS + ("--threads", "1", "--seed", "2", "--distill-layers", "2")
          + AUGMENT_FLAGS, max_hours=1.45),
)


@dataclass(frozen=True)
class Layout:
    """Where every stage reads and writes, all under ``data`` except ``out``."""

    data: Path
    out: Path
    audio_root: Path = TEST_AUDIO_ROOT

    @property
    def wctc(self) -> Path:
        return self.data / "wctc"

    @property
    def feats(self) -> Path:
        return self.wctc / "feats_s5"

    @property
    def lm(self) -> Path:
        return self.data / "lm" / "wctc_run"

    @property
    def eval(self) -> Path:
        return self.wctc / "eval" / "wctc_run"

    def ckpt(self, round_name: str) -> Path:
        return self.wctc / f"ckpt_{round_name}"

    def final(self, round_name: str) -> Path:
        return self.ckpt(round_name) / "final.pt"


def train_argv(r: Round, layout: Layout, max_hours: float | None = None) -> list[str]:
    """``recipes.whisper_ctc.train`` arguments of round ``r`` (``max_hours`` overrides its bound)."""
    argv = ["--ckpt", str(layout.ckpt(r.name)), "--feats", str(layout.feats),
            "--train-splits", *r.train_splits,
            "--max-hours", str(r.max_hours if max_hours is None else max_hours)]
    if r.max_steps > 0:
        argv += ["--max-steps", str(r.max_steps)]
    if r.init_from is not None:
        argv += ["--init-ckpt", str(layout.final(r.init_from))]
    return argv + list(r.flags)


def train_rounds(layout: Layout, train: Callable[[list[str]], None],
                 rounds: tuple[Round, ...] = ROUNDS, max_hours: float | None = None) -> list[str]:
    """Run every round without a ``final.pt`` through ``train(argv)``, then freeze its
    ``latest.pt`` as ``final.pt``. Returns the names of the rounds trained in this call."""
    trained = []
    for r in rounds:
        final = layout.final(r.name)
        if final.exists():
            print(f"round {r.name}: {final} exists, skipped", flush=True)
            continue
        if r.init_from is not None and not layout.final(r.init_from).exists():
            raise RuntimeError(f"round {r.name} starts from {layout.final(r.init_from)}, "
                               f"which does not exist: run round {r.init_from} first")
        argv = train_argv(r, layout, max_hours)
        print(f"round {r.name}: python -m recipes.whisper_ctc.train {' '.join(argv)}", flush=True)
        train(argv)
        latest = layout.ckpt(r.name) / "latest.pt"
        if not latest.exists():
            raise RuntimeError(f"round {r.name} ended without {latest}")
        tmp = final.with_suffix(".tmp")
        shutil.copyfile(latest, tmp)
        os.replace(tmp, final)  # atomic: final.pt is whole or absent
        trained.append(r.name)
    return trained


def build_lms(layout: Layout, text: Path) -> None:
    """Char 7-gram + word LM from the training sentences ``text`` with the default's flags
    (docs/model.md), skipped when present."""
    from recipes import lm_build

    if not (layout.lm / "char_lm.safetensors").exists():
        lm_build.main(["build", "--order", "7", "--min-context-count", "10", "--glosses",
                       "--text", str(text), "--out", str(layout.lm)])
    if not (layout.lm / "word_lm.safetensors").exists():
        lm_build.main(["words", "--bigram-min-count", "1", "--text", str(text),
                       "--out", str(layout.lm)])


def evaluate(layout: Layout, ckpt: Path) -> None:
    """Greedy WER, log-prob dump + beam-16 report with both LMs, chunk-boundary offsets."""
    from recipes import lm_build
    from recipes.whisper_ctc import evaluate as evaluation
    from recipes.whisper_ctc import shifts

    evaluation.main(["--ckpt", str(ckpt), "--feats", str(layout.feats),
                        "--out", str(layout.eval), "--logs", str(layout.wctc / "logs")])
    dump = layout.lm / "logprobs.pt"
    lm_build.main(["dump", "--ckpt", str(ckpt), "--out", str(dump), "--feats", str(layout.feats)])
    lm_build.main(["report", "--dump", str(dump), "--char-lm", str(layout.lm),
                   "--lm", str(layout.lm), "--beam", "16"])
    shifts.main(["--ckpt", str(ckpt), "--lm", str(layout.lm), "--beam", "16"])


def export(layout: Layout, ckpt: Path) -> None:
    """The model files into ``<data>/wctc/export_model``, then those + the LMs into ``out``."""
    from recipes.lm_build import package
    from recipes.whisper_ctc.export import export as export_model

    staging = layout.wctc / "export_model"
    report = layout.eval / f"{ckpt.stem}.json"
    size = export_model(ckpt, staging, report if report.exists() else None)
    package(layout.lm, layout.out, staging)
    print(f"exported {ckpt} to {layout.out} ({size / 1e6:.2f} MB weights + LMs)", flush=True)


def run_stage(name: str, args: argparse.Namespace) -> None:
    """One stage of `STAGES` (the data stages go through ``recipes.stages``)."""
    layout: Layout = args.layout
    final = layout.final(ROUNDS[-1].name)
    if name in DATA_STAGES:
        run_data_stage(name, args)
    elif name == "digits":
        from recipes import digit_strings

        digit_strings.main(["--data", str(args.data), "--audio-root", str(args.audio_root),
                            "--workers", "1"])
    elif name == "feats":
        from recipes.whisper_ctc import feats

        feats.main(["--data", str(args.data), "--out", str(layout.feats),
                         "--workers", str(WORKERS), "--splits", *FEAT_SPLITS])
    elif name == "train":
        from recipes.whisper_ctc import train

        train_rounds(layout, train.main, max_hours=args.max_hours)
    elif name == "lm":
        build_lms(layout, args.data / "text" / "train.txt")
    elif not final.exists():
        raise RuntimeError(f"stage {name} needs {final}: run the train stage first")
    elif name == "evaluate":
        evaluate(layout, final)
    else:
        export(layout, final)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma list of {STAGES}")
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--audio-root", type=Path, default=TEST_AUDIO_ROOT)
    parser.add_argument("--out", type=Path, default=None,
                        help="model dir (default <data>/wctc/export; oasr/assets/default_model "
                             "replaces the bundled one)")
    parser.add_argument("--max-hours", type=float, default=None,
                        help="bound every training round's launch by this (default per round: "
                             + ", ".join(f"{r.name} {r.max_hours}" for r in ROUNDS) + ")")
    args = parser.parse_args(argv)
    if args.max_hours is not None and args.max_hours <= 0:
        parser.error(f"--max-hours {args.max_hours} must be > 0")
    args.stage_list = parse_stages(args.stages, STAGES)
    out = args.data / "wctc" / "export" if args.out is None else args.out
    args.layout = Layout(args.data, out, args.audio_root)
    # what the data stages (recipes.stages) read
    args.num_train, args.workers = NUM_TRAIN_UTTERANCES, WORKERS
    return args


def main(argv: list[str] | None = None) -> list[tuple[str, float]]:
    args = parse_args(argv)
    return run_stages(args.stage_list, lambda name: run_stage(name, args),
                      args.data / "logs")


if __name__ == "__main__":
    main()
