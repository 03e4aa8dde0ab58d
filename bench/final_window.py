"""What the encoder's window costs the finals: the segment's window against the whole 30 s.

Every file goes through the engine as a live server decodes it (the endpointer's segments, the
second pass with the guard against the first pass, no context carried), once per window of
``--windows``: by default the final's encoder on the segment plus 2 s rounded up to 0.5 s (the
rest of the window silence's states: the default) and on Whisper's whole 30 s window
(``--second-pass-window full``); ``fit:MARGIN:BUCKET`` names any other segment window in
seconds; ``--fast`` decodes every final as a busy server does (greedy). It prints the word
errors per subset and the wall time of each run.

    python bench/stress_set.py --out /tmp/oasr-stress
    python bench/read_passages.py --out /tmp/passages
    python bench/final_window.py --stress /tmp/oasr-stress --passages /tmp/passages
    python bench/final_window.py --stress /tmp/oasr-stress --passages /tmp/passages \
        --windows fit:2:0.5 fit:2:2 fit:2:0.5 fit:2:2
    for seed in 16 17 18; do python bench/stress_set.py --seed $seed --out /tmp/stress-$seed; done
    python bench/final_window.py --stress /tmp/stress-16 /tmp/stress-17 /tmp/stress-18 \
        --windows fit:2:0.5 fit:1.5:0.5 fit:1:0.5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from final_context import error_counts, load_items, per_subset
from second_pass_parity import add_stress_argument, engine_config, run_engine

from oasr.benchmarks.workload import DEVSET_DIR
from oasr.engine import EngineConfig, configure_process
from oasr.engine.second_pass.guard import FirstPassGuard
from oasr.models.whisper.window import EncoderWindow


def parse_window(text: str) -> EncoderWindow:
    """``full``, or ``fit:MARGIN:BUCKET`` (seconds) -> an `EncoderWindow`."""
    if text == "full":
        return EncoderWindow("full")
    parts = text.split(":")
    try:
        if len(parts) != 3 or parts[0] != "fit":
            raise ValueError("not full or fit:MARGIN:BUCKET")
        return EncoderWindow("fit", float(parts[1]), float(parts[2]))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"window {text!r}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_stress_argument(parser)
    parser.add_argument("--passages", type=Path, default=None, help="a read_passages.py directory")
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--windows", nargs="+", type=parse_window,
                        default=[EncoderWindow(), EncoderWindow("full")],
                        help="windows to run, in order: full or fit:MARGIN:BUCKET (seconds); "
                             "default: the served window (fit:2:0.5) and full")
    parser.add_argument("--fast", action="store_true",
                        help="every final greedy on its own window, as a busy server decodes them")
    parser.add_argument("--out", type=Path, default=None, help="per-file texts as JSON")
    args = parser.parse_args(argv)
    configure_process(args.threads)
    items = load_items(args.passages, args.stress, args.devset, None)
    decode = EngineConfig().second_pass_decode
    for i, window in enumerate(args.windows):
        name = f"{window.mode} #{i}" if window.mode == "full" else (
            f"{window.mode}:{window.margin_s:g}:{window.bucket_s:g} #{i}")
        windows = replace(decode, encoder_window=window, refine_window=window)
        config = engine_config("whisper", windows, FirstPassGuard(), args.threads, context_s=0.0)
        if args.fast:
            config = replace(config, second_pass_fast_backlog=0)
        start = time.perf_counter()
        run_engine(items, config, name)
        seconds = time.perf_counter() - start
        total, subsets = error_counts(items, name)
        print(f"{name}: {total.word_errors}/{total.words} word errors ({total.wer:.2f} %) in "
              f"{seconds:.0f} s; {per_subset(subsets)}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(
            [{"file": i.path.name, "reference": i.reference,
              **{k: v["text"] for k, v in i.results.items()}} for i in items], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
