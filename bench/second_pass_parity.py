"""The second pass against the reference decoder, on the stress set and the devset.

For every file (each one segment of at most 30 s) it reports, side by side:

- ``ref``: faster-whisper (CTranslate2) on the very same tiny.en weights, as a new user runs it
  (``beam_size=5``, its default temperature fallback, ``language="en"``);
- ``alone``: oasr's second pass on the whole file (``ContinuousWhisperDecoder``, one request at
  a time, timed: the decode-time ratio against ``ref`` is per segment);
- ``finals``: what a user keeps: the file through the engine (``oasr transcribe``'s path, the
  endpointer's segments, the second pass and the guard against the first pass), with how
  many finals fell back to a higher temperature or were rejected for the CTC text;
- ``ctc``: the same engine with ``--second-pass none`` (the first pass alone).

``--compare`` runs ``alone`` and ``finals`` twice in one run, without the safeguards (plain
greedy, no guard: the second pass as it was) and with them. WER after
``oasr.text.wer.normalize_transcript`` (digits and number words scored alike).

    pip install -e ".[bench]"     # faster-whisper, the reference
    python bench/stress_set.py --out /tmp/oasr-stress
    python bench/second_pass_parity.py --stress /tmp/oasr-stress --compare --out parity.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import soundfile as sf

from oasr.benchmarks.workload import DEVSET_DIR
from oasr.engine import configure_process
from oasr.engine.config import SECOND_PASS_BEAM_SIZE, EngineConfig
from oasr.engine.engine import ASREngine
from oasr.engine.offline import transcribe_files
from oasr.engine.options import OFFLINE_FINAL_CONTEXT_S
from oasr.engine.second_pass.guard import FirstPassGuard
from oasr.models.whisper import default_model_dir, load_whisper
from oasr.models.whisper.continuous import ContinuousWhisperDecoder
from oasr.models.whisper.transcriber import WhisperDecodeConfig, without_safeguards
from oasr.text.wer import ErrorCounts, normalize_transcript


@dataclass
class Item:
    path: Path
    subset: str
    reference: str
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # column -> result


def add_stress_argument(parser: argparse.ArgumentParser) -> None:
    """``--stress DIR ...``: one or more stress_set.py directories (`load_items`'s ``stress``)."""
    parser.add_argument("--stress", type=Path, nargs="+", default=[],
                        help="stress_set.py directories (several: other --seed values, more "
                             "digit strings)")


def load_items(stress: Sequence[Path], devset: Path | None) -> list[Item]:
    """Each stress set's files in turn (their subsets pooled by name), then the devset's."""
    items: list[Item] = []
    for directory in stress:
        for line in (directory / "manifest.tsv").read_text().splitlines():
            name, subset, text = line.split("\t")
            items.append(Item(directory / name, subset, text))
    if devset is not None:
        for line in (devset / "manifest.tsv").read_text().splitlines():
            name, text = line.split("\t")
            if name.startswith(("real_", "tts_")):
                subset = "devset_real" if name.startswith("real_") else "devset_synthetic"
                items.append(Item(devset / name, subset, text))
    return items


def run_reference(items: list[Item], threads: int) -> None:
    from faster_whisper import WhisperModel

    model = WhisperModel(str(default_model_dir()), device="cpu", compute_type="float32",
                         cpu_threads=threads)
    for item in items:
        audio = sf.read(item.path, dtype="float32")[0]
        start = time.perf_counter()
        segments = list(model.transcribe(audio, beam_size=5, language="en")[0])
        item.results["ref"] = {
            "text": " ".join(s.text.strip() for s in segments),
            "seconds": time.perf_counter() - start,
            "tokens": sum(len(s.tokens) for s in segments),
            "fallback": any(s.temperature > 0 for s in segments),
        }


def run_alone(items: list[Item], config: WhisperDecodeConfig, column: str) -> None:
    decoder = ContinuousWhisperDecoder(load_whisper(device="cpu"), config)
    for item in items:
        audio = sf.read(item.path, dtype="float32")[0]
        start = time.perf_counter()
        decoder.submit(0, audio)
        results = []
        while decoder.has_work():
            results += decoder.step()
        (result,) = results
        item.results[column] = {
            "text": result.text, "seconds": time.perf_counter() - start,
            "tokens": len(result.tokens), "fallback": result.num_decodes > 1,
            "failed": result.failed,
        }


def run_engine(items: list[Item], config: EngineConfig, column: str) -> dict[str, Any]:
    engine = ASREngine(config)
    results = transcribe_files(config, [i.path for i in items], progress=False, engine=engine)
    for item, result in zip(items, results, strict=True):
        if result.finish_reason != "stop":
            raise RuntimeError(f"{item.path.name} ended {result.finish_reason!r}: {result.error}")
        item.results[column] = {"text": result.text,
                                "sources": [s["source"] for s in result.segments]}
    engine.shutdown()
    return engine.latest_stats().second_pass.to_json()


def engine_config(second_pass: str, decode: WhisperDecodeConfig,
                  guard: FirstPassGuard | None, threads: int,
                  context_s: float = OFFLINE_FINAL_CONTEXT_S) -> EngineConfig:
    """``oasr transcribe``'s engine (offline: every final decoded in full, with the previous
    segment as context unless ``context_s`` is 0)."""
    from oasr.decoding import GpuDecoderConfig
    from oasr.engine.options import default_beam_size

    # a pool for 32 streams of 30 s (64 blocks each), not one sized from free memory: a pool
    # that ran short would end streams early ("length") and score truncated texts
    return EngineConfig(
        decoder=GpuDecoderConfig(beam_size=default_beam_size(None, "auto")),
        max_batch_size=32, max_num_blocks=32 * 64,
        num_threads=threads, second_pass=second_pass, second_pass_decode=decode,
        final_guard=guard, max_wait_time_s=math.inf, idle_timeout_s=math.inf,
        max_session_s=math.inf, max_pending_audio_s=math.inf,
        second_pass_max_backlog=sys.maxsize, second_pass_fast_backlog=None, early_final_s=0.0,
        second_pass_yield_s=None,
        final_context_s=context_s, light_load_context_s=0.0,  # as oasr transcribe: at any load
        refine=None,  # offline, as oasr transcribe
    )


def subset_rows(items: list[Item], columns: list[str]) -> list[dict[str, Any]]:
    rows = []
    for subset in dict.fromkeys(i.subset for i in items):
        group = [i for i in items if i.subset == subset]
        row: dict[str, Any] = {"subset": subset, "files": len(group),
                               "words": sum(len(normalize_transcript(i.reference).split())
                                            for i in group)}
        for column in columns:
            counts = ErrorCounts()
            for item in group:
                counts.add(item.reference, item.results[column]["text"])
            row[f"wer_{column}"] = round(counts.wer, 1)
        for column in columns:
            if column.startswith("alone"):
                row[f"fallbacks_{column}"] = sum(i.results[column]["fallback"] for i in group)
                row[f"failed_{column}"] = sum(i.results[column]["failed"] for i in group)
                row[f"time_ratio_max_{column}"] = round(max(
                    i.results[column]["seconds"] / i.results["ref"]["seconds"] for i in group), 2)
            if column.startswith("finals"):
                ratios = [_words(i.results[column]["text"]) / _words(i.results["ref"]["text"])
                          for i in group if _words(i.results["ref"]["text"])]
                row[f"words_ratio_max_{column}"] = round(max(ratios, default=0.0), 2)
                for source in ("ctc", "combined"):
                    row[f"{source}_finals_{column}"] = sum(
                        s == source for i in group for s in i.results[column]["sources"])
        row["fallbacks_ref"] = sum(i.results["ref"]["fallback"] for i in group)
        rows.append(row)
    return rows


def _words(text: str) -> int:
    return len(normalize_transcript(text).split())


def print_table(rows: list[dict[str, Any]], columns: Iterable[str]) -> None:
    keys = ["subset", "files", "words", *columns]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row.get(k, "")) for k in keys) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_stress_argument(parser)
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--no-devset", action="store_true")
    parser.add_argument("--compare", action="store_true",
                        help="also run without the safeguards and the guard (as before)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--beam", type=int, default=SECOND_PASS_BEAM_SIZE,
                        help="oasr's beam at temperature 0 (1: greedy)")
    parser.add_argument("--limit", type=int, default=None, help="first N files only")
    parser.add_argument("--out", type=Path, default=None, help="write per-file JSON here")
    args = parser.parse_args(argv)
    configure_process(args.threads)
    items = load_items(args.stress, None if args.no_devset else args.devset)[: args.limit]
    decode = replace(EngineConfig().second_pass_decode, beam_size=args.beam)
    guard = FirstPassGuard()
    variants: dict[str, tuple[WhisperDecodeConfig, FirstPassGuard | None, float]] = {
        "": (decode, guard, OFFLINE_FINAL_CONTEXT_S)}
    if args.compare:  # the second pass as it was: greedy, no safeguards, no guard, no context
        plain = without_safeguards(WhisperDecodeConfig())  # greedy, the segment's window
        variants = {"_plain": (plain, None, 0.0), **variants}
    run_reference(items, args.threads)
    stats = {}
    for suffix, (dec, grd, context_s) in variants.items():
        run_alone(items, replace(dec, max_rows=8), f"alone{suffix}")
        stats[f"finals{suffix}"] = run_engine(
            items, engine_config("whisper", dec, grd, args.threads, context_s), f"finals{suffix}")
    run_engine(items, engine_config("none", decode, None, args.threads), "ctc")
    columns = ["ref", *[f"{c}{s}" for s in variants for c in ("alone", "finals")], "ctc"]
    rows = subset_rows(items, columns)
    wer_cols = [f"wer_{c}" for c in columns]
    extra = [k for k in rows[0] if k not in ("subset", "files", "words", *wer_cols)]
    print_table(rows, wer_cols)
    print()
    print_table(rows, extra)
    for name, snap in stats.items():
        print(f"{name}: temperature fallbacks {snap.get('num_temperature_fallbacks')}, "
              f"rejected {snap.get('rejected')}, combined {snap.get('num_combined')}, "
              f"backlog full {snap.get('num_backlog_full')}")
    if args.out is not None:
        args.out.write_text(json.dumps({
            "rows": rows, "engine": stats,
            "files": [{"file": i.path.name, "subset": i.subset, "reference": i.reference,
                       **i.results} for i in items]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
