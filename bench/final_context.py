"""Finals with and without the previous segment carried as context, per endpointing rule.

A segment's second pass can decode the previous segment's audio too, with that segment's
final text forced as the transcript so far (``EngineConfig.final_context_s``), so a short
segment keeps the context of the sentence before it. This measures what that buys, and
whether it makes sentence-pause endpointing (shorter segments, earlier finals) as accurate
as WeNet's rules, on material with several segments per file:

- ``passages``: long read passages (``bench/read_passages.py``): the devset's real read
  recordings re-joined in seeded orders, and public-domain paragraphs read by TTS voices the
  model never trained on (and two it did), sentences joined by 0.6-1.2 s pauses;
- the stress set's subsets (``bench/stress_set.py``): re-spliced digit strings, read speech
  re-levelled / narrowband / joined, held-out voices;
- the devset's real and synthetic files.

Every file goes through the engine as ``oasr transcribe`` runs it (offline: all streams at
once, every second pass awaited). Reported per subset and variant: WER (after
``oasr.text.wer.normalize_transcript``), segments, and finals decoded with context.

    python bench/read_passages.py --out /tmp/passages
    python bench/stress_set.py --out /tmp/oasr-stress
    python bench/final_context.py --passages /tmp/passages --stress /tmp/oasr-stress \\
        --out bench/results_final_context.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from oasr.benchmarks.workload import DEVSET_DIR
from oasr.decoding.endpoint import EndpointConfig
from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.engine.offline import transcribe_files
from oasr.text.wer import ErrorCounts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from second_pass_parity import Item, add_stress_argument  # noqa: E402  (a sibling script)
from second_pass_parity import engine_config as parity_engine_config  # noqa: E402
from second_pass_parity import load_items as load_stress_items  # noqa: E402

PAUSE_S, LONGEST_S = 0.8, 15.0  # the sentence-pause rules: --endpoint-pause 0.8 --max-segment 15
CONTEXT_S = 10.0


def load_items(passages: Path | None, stress: Sequence[Path], devset: Path | None,
               subsets: set[str] | None) -> list[Item]:
    """The passages' files (the text of all their sentences), then each stress set's (their
    subsets pooled by name) and the devset's (as ``bench/second_pass_parity.py`` reads them),
    only ``subsets`` if given."""
    items: list[Item] = []
    if passages is not None:
        for wav in sorted(passages.glob("*.wav")):
            meta = json.loads(wav.with_suffix(".json").read_text())
            subset = "passages_real" if wav.name.startswith("real_") else "passages_tts"
            items.append(Item(wav, subset, " ".join(s["text"] for s in meta["sentences"])))
    items += load_stress_items(stress, devset)
    return [i for i in items if subsets is None or i.subset in subsets]


def sentence_pauses() -> EndpointConfig:
    """``oasr-server --endpoint-pause 0.8 --max-segment 15``'s rules."""
    config = EndpointConfig()
    assert config.rule2 is not None and config.rule3 is not None
    return replace(config, rule2=replace(config.rule2, min_trailing_silence_s=PAUSE_S),
                   rule3=replace(config.rule3, min_utterance_length_s=LONGEST_S),
                   max_cut_window_s=min(config.max_cut_window_s, LONGEST_S / 2))


def engine_config(endpoint: EndpointConfig, context_s: float, threads: int) -> EngineConfig:
    """``bench/second_pass_parity.py``'s offline engine (``oasr transcribe``'s) with these
    endpoint rules and context."""
    default = EngineConfig()
    config = parity_engine_config("whisper", default.second_pass_decode, default.final_guard,
                                  threads, context_s)
    return replace(config, endpoint=endpoint)


def run(items: list[Item], config: EngineConfig, column: str) -> float:
    engine = ASREngine(config)
    started = time.perf_counter()
    results = transcribe_files(config, [i.path for i in items], progress=False, engine=engine)
    seconds = time.perf_counter() - started
    for item, result in zip(items, results, strict=True):
        if result.finish_reason != "stop":
            raise RuntimeError(f"{item.path.name} ended {result.finish_reason!r}: {result.error}")
        item.results[column] = {"text": result.text, "segments": len(result.segments),
                                "sources": [s["source"] for s in result.segments]}
    engine.shutdown()
    return seconds


def error_counts(items: list[Item], column: str) -> tuple[ErrorCounts, dict[str, ErrorCounts]]:
    """Word errors of ``column``'s texts: over all items, and per subset (in item order)."""
    total: ErrorCounts = ErrorCounts()
    subsets: dict[str, ErrorCounts] = {}
    for item in items:
        text = item.results[column]["text"]
        total.add(item.reference, text)
        subsets.setdefault(item.subset, ErrorCounts()).add(item.reference, text)
    return total, subsets


def per_subset(subsets: dict[str, ErrorCounts]) -> str:
    """``subset errors/words`` of each subset, for a run's summary line."""
    return ", ".join(f"{k} {v.word_errors}/{v.words}" for k, v in subsets.items())


def rows(items: list[Item], columns: list[str]) -> list[dict[str, Any]]:
    per_column = {column: error_counts(items, column)[1] for column in columns}
    table = []
    for subset in dict.fromkeys(i.subset for i in items):
        group = [i for i in items if i.subset == subset]
        row: dict[str, Any] = {"subset": subset, "files": len(group)}
        for column in columns:
            row[f"wer_{column}"] = round(per_column[column][subset].wer, 1)
            row[f"segments_{column}"] = sum(i.results[column]["segments"] for i in group)
        table.append(row)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=Path, default=None, help="a read_passages.py dir")
    add_stress_argument(parser)
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--no-devset", action="store_true")
    parser.add_argument("--subsets", nargs="*", default=None, help="only these subsets")
    parser.add_argument("--context", type=float, default=CONTEXT_S,
                        help="final_context_s of the variants with context")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write per-file JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    items = load_items(args.passages, args.stress, None if args.no_devset else args.devset,
                       set(args.subsets) if args.subsets else None)
    variants = {
        "wenet": (EndpointConfig.wenet(), 0.0),
        "wenet_ctx": (EndpointConfig.wenet(), args.context),
        "pause": (sentence_pauses(), 0.0),
        "pause_ctx": (sentence_pauses(), args.context),
    }
    seconds = {}
    for column, (endpoint, context_s) in variants.items():
        seconds[column] = round(run(items, engine_config(endpoint, context_s, args.threads),
                                    column), 1)
        print(f"{column}: {seconds[column]} s", file=sys.stderr)
    table = rows(items, list(variants))
    keys = ["subset", "files"] + [f"{k}_{c}" for c in variants for k in ("wer", "segments")]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in table:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    print(f"seconds per variant: {seconds}")
    if args.out is not None:
        args.out.write_text(json.dumps({
            "rows": table, "seconds": seconds, "context_s": args.context,
            "files": [{"path": str(i.path), "subset": i.subset, "reference": i.reference,
                       "results": i.results} for i in items]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
