"""The CTC prefix beam search's tokens per frame (``--ctc-top-k``): texts and search time.

For each value, ``oasr transcribe --second-pass none`` (beam 16 with the bundled model's char
and word LMs, as the server searches) over the read passages, the stress set and the devset:
word errors against the references, and the words its texts differ by from the first value's
(give the exact one first: 2 x beam + 1 = 33). Then the search alone at several widths,
`bench/decode_cost.py`'s loop over the devset's log-probs, the values taking turns in each
round: median ms per engine step of 32 frames.

    python bench/stress_set.py --out /tmp/oasr-stress
    python bench/read_passages.py --out /tmp/passages
    python bench/ctc_top_k.py --stress /tmp/oasr-stress --passages /tmp/passages
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from oasr.benchmarks.workload import DEVSET_DIR
from oasr.decoding import GpuDecoderConfig
from oasr.lm import load_decoder_lm
from oasr.models.checkpoint import DEFAULT_MODEL_DIR
from oasr.text.wer import ErrorCounts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_cost import StepTimer, devset_log_probs, stream_batch  # noqa: E402  (siblings)
from devset_wer import transcribe  # noqa: E402
from final_context import load_items  # noqa: E402
from second_pass_parity import add_stress_argument  # noqa: E402

BEAM = 16  # the server's


def words_apart(a: str, b: str) -> int:
    """Word edit distance between two texts (normalised as the WER is)."""
    counts = ErrorCounts()
    counts.add(a, b)
    return counts.word_errors


def search_ms(top_ks: list[int], streams: list[int], rounds: int,
              devset: Path = DEVSET_DIR) -> dict[int, dict[int, float]]:
    """Median ms per engine step of the search with each value, per stream count, over the
    bundled model's log-probs of ``devset``'s wavs."""
    lm = load_decoder_lm(DEFAULT_MODEL_DIR)
    setups = {str(k): (GpuDecoderConfig(beam_size=BEAM, top_k=k), lm) for k in top_ks}
    timer = StepTimer(setups, list(lm.units), "cpu")
    rows = devset_log_probs(devset)
    out: dict[int, dict[int, float]] = {}
    for n in streams:
        log_probs = stream_batch(rows, n, 32 * 6)
        times: dict[str, list[float]] = {name: [] for name in setups}
        for _ in range(rounds):
            for name in setups:
                times[name] += [step for step, _ in timer.run(name, log_probs, 32)]
        out[n] = {int(name): statistics.median(t) for name, t in times.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passages", type=Path, default=None, help="a read_passages.py dir")
    add_stress_argument(p)
    p.add_argument("--devset", type=Path, default=DEVSET_DIR)
    p.add_argument("--top-k", type=int, nargs="+", default=[2 * BEAM + 1, BEAM, 12, 8])
    p.add_argument("--streams", type=int, nargs="+", default=[4, 32, 256])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    items = load_items(args.passages, args.stress, args.devset, None)
    files = [i.path for i in items]
    if len({f.name for f in files}) != len(files):  # the texts come back by file name
        raise SystemExit("two of the files have the same name")
    results: list[dict[str, Any]] = []
    first: dict[str, str] | None = None
    for top_k in args.top_k:
        texts, seconds = transcribe("auto", files, ["--beam-size", str(BEAM), "--ctc-top-k",
                                                    str(top_k)], threads=args.threads)
        counts = ErrorCounts()
        for item in items:
            counts.add(item.reference, texts[item.path.name])
        first = first or texts
        apart = [words_apart(first[f], texts[f]) for f in first]
        results.append({"top_k": top_k, "words": counts.words, "word_errors": counts.word_errors,
                        "wer": round(counts.wer, 2), "texts_differing": sum(a > 0 for a in apart),
                        "words_apart": sum(apart), "transcribe_s": round(seconds, 1)})
        print(f"--ctc-top-k {top_k}: {counts.word_errors} word errors in {counts.words} words "
              f"({counts.wer:.2f} %), {sum(a > 0 for a in apart)} of {len(apart)} texts differ "
              f"from --ctc-top-k {args.top_k[0]}'s by {sum(apart)} words, {seconds:.0f} s",
              flush=True)
    timing = search_ms(args.top_k, args.streams, args.rounds, args.devset)
    for n, row in timing.items():
        print(f"search, {n} streams: " + ", ".join(f"top-k {k} {ms:.1f} ms" for k, ms in row.items()))
    if args.out is not None:
        args.out.write_text(json.dumps({"texts": results, "search_ms": timing}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
