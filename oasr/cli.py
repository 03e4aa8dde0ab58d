"""The ``oasr`` command: ``oasr transcribe``, ``oasr export``, ``oasr bench``.

The live server's command, ``oasr-server``, is the web layer's (`backend.cli`): the library
never imports it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from oasr.decoding.context import DEFAULT_BOOST, MAX_HOTWORDS
from oasr.engine.options import (
    OFFLINE_FINAL_CONTEXT_S,
    add_engine_arguments,
    engine_config_from_args,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oasr", description="oasr streaming speech recognition")
    sub = parser.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("transcribe", help="transcribe audio files through the streaming engine")
    tr.add_argument("files", nargs="+", type=Path)
    tr.add_argument("--json", action="store_true", help="one JSON object per file on stdout")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    tr.add_argument("--hotwords", default="", metavar="A,B,...",
                    help="comma-separated terms (names, jargon) both passes are biased towards, "
                    f"at most {MAX_HOTWORDS}; each boosted by {DEFAULT_BOOST:g} per letter")
    tr.add_argument("--prompt", default="", help="text Whisper's second pass is prompted with "
                    "(before the hotwords), as OpenAI's prompt")
    add_engine_arguments(tr)

    ex = sub.add_parser("export", help="write oasr's checkpoint format from a WeNet experiment dir")
    ex.add_argument("src", type=Path, help="WeNet experiment dir (train.yaml, final.pt, units.txt)")
    ex.add_argument("dst", type=Path, help="output dir (model.safetensors, config.json, units.txt)")

    from oasr.benchmarks.runner import build_parser as build_bench_parser

    build_bench_parser(sub.add_parser("bench", help="benchmark the engine against one-stream "
                                      "dense serving (see docs/benchmarks.md)"))

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "transcribe":
        return _transcribe(args)
    if args.command == "export":
        from oasr.models.export import main as export_main

        return export_main([str(args.src), str(args.dst)])
    if args.command == "bench":
        from oasr.benchmarks.runner import run_from_args

        return run_from_args(args)
    parser.error(f"unknown command {args.command}")
    return 2


def _transcribe(args: argparse.Namespace) -> int:
    from oasr.engine.offline import transcribe_files
    from oasr.engine.process import configure_process

    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"oasr transcribe: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    # offline: no latency to protect, so nothing times out and every segment waits for the
    # second pass (a live server keeps the CTC text when Whisper falls behind)
    try:
        config = engine_config_from_args(
            args, max_wait_time_s=math.inf, idle_timeout_s=math.inf, max_session_s=math.inf,
            max_pending_audio_s=math.inf, second_pass_max_backlog=sys.maxsize,
            min_audio_rate=0.0,
            second_pass_fast_backlog=None,  # every final decoded in full, however many wait
            second_pass_yield_s=None,  # audio waits by design: Whisper never waits for it
            final_context_s=(OFFLINE_FINAL_CONTEXT_S if args.final_context is None
                             else args.final_context),
            light_load_context_s=0.0,  # --final-context decides, whatever the load
            early_final_s=0.0,  # no one waits for a final offline
            refine=None,  # no one reads partials offline
        )
    except ValueError as exc:  # a flag's value out of range: say which, no traceback
        print(f"oasr transcribe: {exc}", file=sys.stderr)
        return 2
    configure_process(config.resolved_num_threads)
    from oasr.decoding.context import HotwordError, split_terms

    try:
        results = transcribe_files(config, args.files, progress=not args.no_progress,
                                   hotwords=split_terms(args.hotwords), prompt=args.prompt)
    except HotwordError as exc:  # bad hotwords: say which, no traceback
        print(f"oasr transcribe: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for result in results:
        failed += result.error is not None
        if args.json:
            print(json.dumps(result.to_json(), ensure_ascii=False))
        elif result.error is not None:
            print(f"{result.file}\tERROR: {result.error}")
        else:
            print(f"{result.file}\t{result.text}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
