"""Endpoints between chunks, with and without context, on audio paced as a live stream sends it.

A live server decides an endpoint at a chunk boundary (WeNet's 1 s of trailing silence seen by
the CTC pass, every 640 ms), or, with ``--endpoint-between-chunks``, as soon as the quiet
audio after a stream's last chunk holds the rest of that silence (`oasr.engine.live.quiet_tail`).
The second only acts on audio that arrives in pieces, so this feeds every file to one engine
in 0.1 s pieces, all files at once, stepping the engine after each piece (`oasr transcribe`
hands it whole files, where no stream ever waits between chunks). The second pass decodes
every final (no backlog, no refinements, no early decodes: their timing is the live bench's,
`bench/live_text.py`); the variants differ in where segments end and whether a final carries
the previous segment as context (``--final-context``). Printed per variant: word errors per
subset, segments, endpoints decided between chunks, wall time.

    python bench/stress_set.py --out /tmp/oasr-stress
    python bench/read_passages.py --out /tmp/passages
    python bench/paced_endpoints.py --stress /tmp/oasr-stress --passages /tmp/passages
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from final_context import error_counts, load_items, per_subset
from second_pass_parity import Item, add_stress_argument, engine_config

from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.benchmarks.workload import DEVSET_DIR
from oasr.engine import ASREngine, EngineConfig, configure_process
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.live.quiet_tail import QuietTail
from oasr.engine.offline import FileResult

PIECE_S = 0.1  # what a browser or bench/live_text.py sends at a time
CONTEXT_S = 10.0  # --final-context's value in the variants with context

VARIANTS = {  # name -> (endpoints between chunks, context seconds)
    "chunk": (False, 0.0),
    "chunk_ctx": (False, CONTEXT_S),
    "between": (True, 0.0),
    "between_ctx": (True, CONTEXT_S),
}


def run_paced(items: list[Item], config: EngineConfig, column: str,
              piece_s: float = PIECE_S) -> dict[str, Any]:
    """Every item's audio through one engine in ``piece_s`` pieces, all streams at once; each
    item's result goes to ``item.results[column]``. Returns the engine's endpoint counts."""
    engine = ASREngine(config)
    results = [FileResult(str(i.path)) for i in items]
    audios = [read_audio(i.path) for i in items]
    for stream_id, result in enumerate(results, start=1):
        engine.submit(OpenStream(stream_id, result.on_event))
    piece = round(piece_s * MODEL_SAMPLE_RATE)
    for start in range(0, max(len(a) for a in audios), piece):
        for stream_id, audio in enumerate(audios, start=1):
            if start < len(audio):
                engine.submit(AppendAudio(stream_id, audio[start:start + piece]))
                if start + piece >= len(audio):
                    engine.submit(EndStream(stream_id))
        while engine.step():
            pass
    while not engine.is_idle:
        if not engine.step():
            engine.wait_for_work(0.05)
    stats = engine.latest_stats()
    engine.shutdown()
    for item, result in zip(items, results, strict=True):
        if result.finish_reason != "stop":
            raise RuntimeError(f"{item.path.name} ended {result.finish_reason!r}: {result.error}")
        item.results[column] = {"text": result.text, "segments": len(result.segments)}
    snapshot = stats.to_json()
    return {**snapshot["endpoints"], "between_chunks": snapshot["endpoints_between_chunks"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_stress_argument(parser)
    parser.add_argument("--passages", type=Path, default=None, help="a read_passages.py directory")
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="per-file texts as JSON")
    args = parser.parse_args(argv)
    configure_process(args.threads)
    items = load_items(args.passages, args.stress, args.devset, None)
    default = EngineConfig()
    summary = []
    for name in args.variants:
        between, context_s = VARIANTS[name]
        config = replace(engine_config("whisper", default.second_pass_decode,
                                       default.final_guard, args.threads, context_s=context_s),
                         endpoint_quiet=QuietTail() if between else None,
                         # every file at once, each stream as at a demo's load
                         light_load_streams=len(items),
                         light_load_context_s=0.0,  # the variant's context_s decides
                         min_audio_rate=0.0)  # paced slower than real time on a small box
        started = time.perf_counter()
        endpoints = run_paced(items, config, name)
        seconds = time.perf_counter() - started
        total, subsets = error_counts(items, name)
        segments = sum(item.results[name]["segments"] for item in items)
        line = {"variant": name, "word_errors": total.word_errors, "words": total.words,
                "wer": round(total.wer, 2), "segments": segments, "endpoints": endpoints,
                "seconds": round(seconds), "subsets": {k: v.word_errors for k, v in subsets.items()}}
        summary.append(line)
        print(f"{name}: {total.word_errors}/{total.words} word errors ({total.wer:.2f} %), "
              f"{segments} segments, endpoints {endpoints}, {seconds:.0f} s; {per_subset(subsets)}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"summary": summary, "files": [
            {"file": i.path.name, "reference": i.reference,
             **{k: v["text"] for k, v in i.results.items()}} for i in items]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
