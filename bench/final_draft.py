"""What a draft buys a final's beam search: word errors and decode time per ``draft_min_prob``.

A live segment's final is decoded after refinements of most of its audio; the newest one's
tentative words go to the final's beam search as a draft (``SecondPassJob.draft``), which it
takes where the model, on the whole segment, ranks each draft token first with at least
``draft_min_prob`` (`oasr.models.whisper.decoding.accepted_draft`), and searches from the
first token it does not. This replays that on read sentences: each sentence of the passages
(``bench/read_passages.py``: its audio from 0.3 s before to 0.3 s after its speech) is
decoded greedily without its last ``--cut`` seconds (the draft: a refinement that has not
heard the sentence's end), then by beam search on all of it, without a draft and with it at
each ``--min-probs``. Printed per variant: word errors against the sentences' texts, decode
seconds (one thread, the draft's own decode not counted: live, it was a refinement), and how
many texts differ from the beam's own.

    python bench/read_passages.py --out /tmp/passages
    python bench/final_draft.py --passages /tmp/passages
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from oasr.engine import EngineConfig, configure_process
from oasr.text.wer import ErrorCounts, normalize_transcript

RATE = 16_000
MARGIN_S = 0.3  # audio kept before and after each sentence's speech


def sentences(directories: list[Path], min_s: float = 1.5) -> list[tuple[str, np.ndarray, str]]:
    """(file, audio, text) of each sentence of the passages in ``directories`` (those of at
    least ``min_s`` seconds with their margins)."""
    out = []
    for directory in directories:
        for meta_path in sorted(directory.glob("*.json")):
            audio, rate = sf.read(meta_path.with_suffix(".wav"), dtype="float32")
            if rate != RATE:
                raise ValueError(f"{meta_path.with_suffix('.wav')}: {rate} Hz, want {RATE}")
            for sentence in json.loads(meta_path.read_text())["sentences"]:
                start = max(0, int((sentence["start"] - MARGIN_S) * RATE))
                clip = audio[start:int((sentence["end"] + MARGIN_S) * RATE)]
                if len(clip) >= min_s * RATE:
                    out.append((meta_path.stem, clip, sentence["text"]))
    return out


class Decoder:
    """The second pass's decoder as the server builds it, one request at a time."""

    def __init__(self) -> None:
        from oasr.models.whisper import load_whisper
        from oasr.models.whisper.continuous import ContinuousWhisperDecoder

        self.config = EngineConfig().second_pass_decode_config()
        self.decoder = ContinuousWhisperDecoder(load_whisper(), self.config)

    def decode(self, audio: np.ndarray, fast: bool = False, draft: tuple[int, ...] = (),
               min_prob: float | None = None) -> tuple[float, Any]:
        """(seconds, result) of one decode; greedy when ``fast``."""
        if min_prob is not None:
            self.decoder.config = replace(self.config, draft_min_prob=min_prob)
        try:
            start = time.perf_counter()
            self.decoder.submit(1, audio, fast=fast, draft=draft)
            done: list[Any] = []
            while not done:
                done = self.decoder.step()
            return time.perf_counter() - start, done[0]
        finally:
            self.decoder.config = self.config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=Path, nargs="+", required=True,
                        help="read_passages.py directories")
    parser.add_argument("--cut", type=float, default=1.2,
                        help="seconds at a sentence's end the draft did not hear")
    parser.add_argument("--min-probs", type=float, nargs="+", default=[0.0, 0.5, 0.8])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: a live second-pass process's on two cores)")
    parser.add_argument("--out", type=Path, default=None, help="per-sentence texts as JSON")
    args = parser.parse_args(argv)
    configure_process(args.threads)
    items = sentences(args.passages)
    decoder = Decoder()
    decoder.decode(items[0][1])  # warm up
    names = ["beam", *(f"draft{p:g}" for p in args.min_probs)]
    errors = {name: ErrorCounts() for name in names}
    seconds = dict.fromkeys(names, 0.0)
    differ = dict.fromkeys(names, 0)
    rows = []
    for index, (name, audio, text) in enumerate(items):
        heard = audio[:max(RATE, len(audio) - int(args.cut * RATE))]
        draft = tuple(decoder.decode(heard, fast=True)[1].tokens)
        row: dict[str, Any] = {"file": name, "reference": text}
        for variant, min_prob in zip(names, [None, *args.min_probs], strict=True):
            took, result = (decoder.decode(audio) if min_prob is None
                            else decoder.decode(audio, draft=draft, min_prob=min_prob))
            seconds[variant] += took
            errors[variant].add(text, result.text)
            differ[variant] += normalize_transcript(result.text) != normalize_transcript(
                row.get("beam", result.text))
            row[variant] = result.text
        rows.append(row)
        if index % 20 == 19:
            print(f"{index + 1}/{len(items)} sentences", flush=True)
    print(f"{len(items)} sentences, drafts without their last {args.cut:g} s")
    print("| variant | word errors | WER % | decode s | texts unlike the beam's |")
    print("|---|---|---|---|---|")
    for variant in names:
        print(f"| {variant} | {errors[variant].word_errors} | {errors[variant].wer:.2f} | "
              f"{seconds[variant]:.1f} | {differ[variant]} |")
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
