"""Chunk-boundary robustness: devset WER with 0-0.8 s of leading silence, per checkpoint.

A 640 ms chunk boundary that falls inside a word costs the streaming model more than one that
falls in a pause, so a small devset's WER moves by several points with where the boundaries
land. Prepending digital silence moves all of them; averaging over a few offsets compares two
checkpoints on the model rather than on the luck of the boundaries. One row per checkpoint:
WER at each offset with beam search + the model dir's LMs (``--lm``), their mean, and the
greedy mean.

    python -m recipes.whisper_ctc.shifts --ckpt A.pt B.pt --lm oasr/assets/default_model --prefix real_
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from recipes.lm_build import WORD_SETTINGS, decode_set
from recipes.whisper_ctc.evaluate import DEVSET, chunked_rows, devset_utterances, load_for_eval

OFFSETS_S = (0.0, 0.1, 0.2, 0.4, 0.8)


def shift_row(source: Path, lm: object, devset: Path, prefix: str, beam: int,
              offsets: tuple[float, ...] = OFFSETS_S) -> dict:
    """{"lm": [WER per offset], "greedy": [...], "lm_mean", "greedy_mean"} of one checkpoint."""
    model, _ = load_for_eval(source)
    with_lm, greedy = [], []
    for offset in offsets:
        rows = chunked_rows(model, devset_utterances(devset, prefix, offset))
        with_lm.append(round(decode_set(rows, beam, lm, settings=WORD_SETTINGS)[0], 1))
        greedy.append(round(decode_set(rows, 1)[0], 1))
    return {"lm": with_lm, "greedy": greedy, "lm_mean": round(statistics.mean(with_lm), 1),
            "greedy_mean": round(statistics.mean(greedy), 1)}


def main(argv: list[str] | None = None) -> None:
    from oasr.lm import load_decoder_lm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, nargs="+", required=True,
                        help="training .pt files (copies) or model dirs")
    parser.add_argument("--lm", type=Path, default=Path("oasr/assets/default_model"))
    parser.add_argument("--devset", type=Path, default=DEVSET)
    parser.add_argument("--prefix", default="real_")
    parser.add_argument("--beam", type=int, default=8)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lm = load_decoder_lm(args.lm)
    print(f"| checkpoint | {' | '.join(f'{o:g} s' for o in OFFSETS_S)} | mean | greedy mean |")
    print("|---" * (len(OFFSETS_S) + 3) + "|")
    for source in args.ckpt:
        r = shift_row(source, lm, args.devset, args.prefix, args.beam)
        cells = " | ".join(f"{w:.1f}" for w in r["lm"])
        print(f"| {source} | {cells} | {r['lm_mean']:.1f} | {r['greedy_mean']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
