"""The second pass's finals decoded in batches, as the server's worker decodes them when many
segments end together: seconds per batch, and the texts (to compare two checkouts' output).

Each batch is submitted at once to one `ContinuousWhisperDecoder` with the server's decode
settings (`EngineConfig().second_pass_decode`: beam 5, int8 logits, the served dtype) and
stepped until every final is out, on ``--threads`` torch threads (the worker's one by
default). Batches, from the dev set's recordings (in the repository) and, with ``--passages``,
from `read_passages.py`'s longer read passages:

- ``dev``: every dev-set recording (28 segments of 2-11 s) at once;
- ``dev-5s``: the first 5 s of the 8 longest recordings;
- ``passages-17.5s`` / ``passages-10s`` / ``passages-5s`` (``--passages``): 6 segments of
  17.5 s (the passages' starts, as lockstep clients end their first sentence together),
  8 of 10 s and 8 of 5 s from the passages' middles.

With ``--fast`` every final is decoded as a busy server decodes them (more finals waiting
than ``--second-pass-fast-backlog``) and as refinements are: greedy, each segment on its own
window, rows joining and leaving the running batch as the decoder steps.

Rounds alternate the batches; each prints its median. ``--out`` writes the seconds and the
texts; ``--against`` an earlier ``--out`` names the texts that differ.

    python bench/read_passages.py --out /tmp/passages
    python bench/beam_batches.py --passages /tmp/passages --rounds 3 --out /tmp/after.json
    (cd ../before && python bench/beam_batches.py --passages /tmp/passages --out /tmp/before.json)
    python bench/beam_batches.py --passages /tmp/passages --against /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from oasr import cpu
from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.benchmarks.report import machine_description
from oasr.benchmarks.second_pass import decode_together
from oasr.benchmarks.workload import DEVSET_DIR

Batch = list[np.ndarray]


def clips(audio: list[np.ndarray], seconds: float, offsets: list[float]) -> Batch:
    """``seconds`` of each recording from its offset (the offset pulled back to fit)."""
    n = int(seconds * MODEL_SAMPLE_RATE)
    out = []
    for wave, offset in zip(audio, offsets, strict=False):
        start = max(0, min(int(offset * MODEL_SAMPLE_RATE), len(wave) - n))
        out.append(wave[start : start + n])
    return out


def batches(devset: Path, passages: Path | None) -> dict[str, Batch]:
    dev = [read_audio(f) for f in sorted(devset.glob("*.wav"))]
    longest = sorted(dev, key=len, reverse=True)[:8]
    out = {"dev": [w[: 30 * MODEL_SAMPLE_RATE] for w in dev],
           "dev-5s": clips(longest, 5.0, [0.0] * 8)}
    if passages is not None:
        read = [read_audio(f) for f in sorted(passages.glob("*.wav"))]
        if len(read) < 14:
            raise SystemExit(f"{passages}: {len(read)} passages, 14 or more wanted "
                             "(python bench/read_passages.py --out DIR)")
        out["passages-17.5s"] = clips(read[:6], 17.5, [0.0] * 6)
        out["passages-10s"] = clips(read[3:11], 10.0, [20, 14, 8, 22, 5, 17, 11, 2])
        out["passages-5s"] = clips(read[6:14], 5.0, [3, 7, 11, 2, 9, 5, 13, 4])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=Path, default=None,
                        help="a read_passages.py directory (adds the passages' batches)")
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (after one untimed)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--fast", action="store_true",
                        help="greedy finals on the segments' own windows (a busy server's)")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default=None,
                        help="Whisper's dtype (default: the server's, --second-pass-dtype)")
    parser.add_argument("--out", type=Path, default=None, help="write seconds and texts here")
    parser.add_argument("--against", type=Path, default=None,
                        help="an earlier --out: print the texts that differ from it")
    args = parser.parse_args(argv)

    from oasr.engine import EngineConfig
    from oasr.models.whisper.continuous import ContinuousWhisperDecoder
    from oasr.models.whisper.transcriber import load_for_decoding

    torch.set_num_threads(args.threads)
    config = EngineConfig().second_pass_decode
    if args.dtype is not None:
        config = replace(config, dtype=args.dtype)
    checkpoint = load_for_decoding(config, torch.device("cpu"))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    work = batches(args.devset, args.passages)

    def decode(batch: Batch) -> list[str]:
        return [r.text for r in decode_together(decoder, batch, args.fast)]

    for batch in work.values():  # untimed: the first decodes of each shape
        decode(batch)
    seconds: dict[str, list[float]] = {name: [] for name in work}
    texts: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, batch in work.items():
            start = time.perf_counter()
            texts[name] = decode(batch)
            seconds[name].append(time.perf_counter() - start)

    machine = machine_description(torch.device("cpu"))
    decoding = "greedy, own windows" if args.fast else f"beam {config.beam_size}"
    print(f"{cpu.summary(machine)}, {args.threads} thread(s), torch {machine['torch']}, "
          f"{checkpoint.model.dtype}, {decoding}, logits {config.logits}; median of "
          f"{args.rounds} rounds, 1-min load {machine.get('load_average_1min_at_start')}")
    print("| batch | segments | audio s | decode s (median) | rounds |")
    print("|---|---|---|---|---|")
    for name, batch in work.items():
        audio_s = sum(len(w) for w in batch) / MODEL_SAMPLE_RATE
        print(f"| {name} | {len(batch)} | {audio_s:.1f} | {statistics.median(seconds[name]):.3f} "
              f"| {', '.join(f'{s:.3f}' for s in seconds[name])} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"seconds": seconds, "texts": texts}, indent=1))
    if args.against is not None:
        earlier = json.loads(args.against.read_text())["texts"]
        differ = 0
        for name, got in texts.items():
            for i, (before, now) in enumerate(zip(earlier.get(name, []), got, strict=False)):
                if before != now:
                    differ += 1
                    print(f"{name}[{i}]\n  - {before}\n  + {now}")
        compared = sum(min(len(earlier.get(n, [])), len(t)) for n, t in texts.items())
        print(f"{differ} of {compared} texts differ from {args.against}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
