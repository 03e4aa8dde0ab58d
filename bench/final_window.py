"""What the encoder's window costs the finals: the segment's window against the whole 30 s.

Every file goes through the engine as a live server decodes it (the endpointer's segments, the
second pass with the guard against the first pass, no context carried), once with the final's
encoder on the segment plus 2 s (the rest of the window silence's states: the default) and once
on Whisper's whole 30 s window (``--second-pass-window full``). It prints the word errors per
subset and the wall time of each run.

    python bench/stress_set.py --out /tmp/oasr-stress
    python bench/read_passages.py --out /tmp/passages
    python bench/final_window.py --stress /tmp/oasr-stress --passages /tmp/passages
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from final_context import error_counts, load_items, per_subset
from second_pass_parity import engine_config, run_engine

from oasr.benchmarks.workload import DEVSET_DIR
from oasr.engine import EngineConfig, configure_process
from oasr.engine.second_pass.guard import FirstPassGuard
from oasr.models.whisper.window import EncoderWindow


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stress", type=Path, default=None, help="a stress_set.py directory")
    parser.add_argument("--passages", type=Path, default=None, help="a read_passages.py directory")
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="per-file texts as JSON")
    args = parser.parse_args(argv)
    configure_process(args.threads)
    items = load_items(args.passages, args.stress, args.devset, None)
    decode = EngineConfig().second_pass_decode
    for name, window in (("segment", EncoderWindow()), ("full", EncoderWindow("full"))):
        config = engine_config("whisper", replace(decode, encoder_window=window),
                               FirstPassGuard(), args.threads, context_s=0.0)
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
