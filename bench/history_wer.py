"""WER of the engine's CTC finals per attention history (``--num-left-chunks``), in one run.

Each history runs ``oasr transcribe --json --second-pass none`` (as `devset_wer.py` does: the
bundled model, its default decoding, float32, one thread) over the devset's files and over
long streams made from them, and scores them the same way. The devset's clips are 2-11 s, so
a bounded history only matters for the longest; the long streams join one speaker's clips
with 0.4 s gaps (shorter than the 1 s silence endpoint), so their segments run 20-35 s and
every history bound below that evicts.

    python bench/history_wer.py --left-chunks -1 8 16 --out bench/results_history_wer.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile
from devset_wer import SETS, score, transcribe

from oasr.benchmarks.workload import DEVSET_DIR
from oasr.text.wer import ErrorCounts, normalize_transcript

GAP_S = 0.4
LONG_STREAMS = {  # name -> the clips it joins, in order
    "long_austen.wav": "real_sense_and_sensibility_",
    "long_digits.wav": "real_george_",
    "long_tts.wav": "tts_",
}


def make_long_streams(devset: Path, references: dict[str, str], out: Path) -> dict[str, str]:
    """Write the long streams under ``out``; returns their references by file name."""
    long_refs = {}
    for name, prefix in LONG_STREAMS.items():
        clips = sorted(f for f in references if f.startswith(prefix))
        pieces = []
        for clip in clips:
            samples, rate = soundfile.read(str(devset / clip), dtype="float32")
            assert rate == 16000, f"{clip}: {rate} Hz"
            pieces += [samples, np.zeros(int(GAP_S * rate), dtype=np.float32)]
        soundfile.write(str(out / name), np.concatenate(pieces), 16000, subtype="PCM_16")
        long_refs[name] = " ".join(references[clip] for clip in clips)
    return long_refs


def score_long(texts: dict[str, str], references: dict[str, str]) -> dict[str, float]:
    counts = ErrorCounts()
    for file, ref in sorted(references.items()):
        counts.add(normalize_transcript(ref), normalize_transcript(texts[file]))
    return {"wer": round(counts.wer, 2), "cer": round(counts.cer, 2), "words": counts.words,
            "word_errors": counts.word_errors}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--left-chunks", nargs="+", type=int, default=[-1, 8, 16])
    p.add_argument("--devset", type=Path, default=DEVSET_DIR)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    references = dict(line.split("\t", 1) for line in
                      (args.devset / "manifest.tsv").read_text().splitlines() if "\t" in line)
    references = {k: v.strip() for k, v in references.items() if k.startswith(tuple(SETS.values()))}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        long_refs = make_long_streams(args.devset, references, Path(tmp))
        files = [args.devset / name for name in sorted(references)]
        files += [Path(tmp) / name for name in sorted(long_refs)]
        for left in args.left_chunks:
            texts, seconds = transcribe(args.dtype, files, ["--num-left-chunks", str(left)])
            rows[str(left)] = score(texts, references) | {
                "long": score_long(texts, long_refs), "seconds": round(seconds, 1),
                "texts": texts}
    print("| --num-left-chunks | real WER % | synthetic WER % | long streams WER % | "
          "long CER % | wall s |")
    print("|---|---|---|---|---|---|")
    for left, r in rows.items():
        print(f"| {left} | {r['real']['wer']:.1f} ({r['real']['word_errors']}) | "
              f"{r['synthetic']['wer']:.1f} ({r['synthetic']['word_errors']}) | "
              f"{r['long']['wer']:.1f} ({r['long']['word_errors']}) | {r['long']['cer']:.1f} | "
              f"{r['seconds']} |")
    if args.out:
        args.out.write_text(json.dumps({"date_utc": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime()),
                                        "dtype": args.dtype, "gap_s": GAP_S,
                                        "histories": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
