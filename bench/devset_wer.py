"""WER of the engine's CTC finals on the devset, per model dtype (float32 / bfloat16 / int8).

Each dtype runs ``python -m oasr.cli transcribe --json --no-progress --threads 1
--second-pass none --dtype X`` over ``devset/{real,tts}_*.wav`` (the bundled model and its
default decoding: beam 16 + the model dir's LMs when it has them), and the text is scored
against ``manifest.tsv`` with `oasr.text.wer.ErrorCounts` after `normalize_transcript`, real
recordings and synthetic speech apart.

    python bench/devset_wer.py --dtypes float32 bfloat16 int8 --out bench/results_wer.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from oasr.benchmarks.workload import DEVSET_DIR
from oasr.text.wer import ErrorCounts, normalize_transcript

SETS = {"real": "real_", "synthetic": "tts_"}


def transcribe(dtype: str, files: list[Path], extra: list[str],
               threads: int = 1) -> tuple[dict[str, str], float]:
    """Texts by file name from one ``oasr transcribe`` run, and its wall seconds."""
    cmd = [sys.executable, "-m", "oasr.cli", "transcribe", "--json", "--no-progress",
           "--threads", str(threads), "--second-pass", "none", "--dtype", dtype, *extra,
           *map(str, files)]
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - start
    texts = {Path(r["file"]).name: r["text"] for r in map(json.loads, out.splitlines())}
    return texts, seconds


def score(texts: dict[str, str], references: dict[str, str]) -> dict[str, dict[str, float]]:
    """WER / CER (percent) and counts per set."""
    result = {}
    for name, prefix in SETS.items():
        counts = ErrorCounts()
        for file, ref in sorted(references.items()):
            if file.startswith(prefix):
                counts.add(normalize_transcript(ref), normalize_transcript(texts[file]))
        result[name] = {"wer": round(counts.wer, 2), "cer": round(counts.cer, 2),
                        "words": counts.words, "word_errors": counts.word_errors,
                        "utterances": counts.utterances}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8"])
    p.add_argument("--devset", type=Path, default=DEVSET_DIR)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("extra", nargs="*", help="more transcribe flags, after --")
    args = p.parse_args(argv)
    references = dict(line.split("\t", 1) for line in
                      (args.devset / "manifest.tsv").read_text().splitlines() if "\t" in line)
    references = {k: v.strip() for k, v in references.items() if k.startswith(tuple(SETS.values()))}
    files = [args.devset / name for name in sorted(references)]
    rows = {}
    for dtype in args.dtypes:
        texts, seconds = transcribe(dtype, files, args.extra)
        rows[dtype] = score(texts, references) | {"seconds": round(seconds, 1),
                                                  "texts": texts}
    print("| dtype | real WER % | real CER % | synthetic WER % | synthetic CER % | wall s |")
    print("|---|---|---|---|---|---|")
    for dtype, r in rows.items():
        print(f"| {dtype} | {r['real']['wer']:.1f} | {r['real']['cer']:.1f} | "
              f"{r['synthetic']['wer']:.1f} | {r['synthetic']['cer']:.1f} | {r['seconds']} |")
    if args.out:
        args.out.write_text(json.dumps({"date_utc": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime()),
                                        "files": len(files), "dtypes": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
