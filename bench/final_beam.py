"""What the second pass's beam width buys and costs: the finals' word errors and decode time
for each beam size.

Every file goes through the engine as ``oasr transcribe`` decodes it (the endpointer's
segments, the guard against the first pass, the previous segment as context), once per beam
size (``--beams``, default 1 3 5; 5 is the default, 1 greedy). It prints per beam the word
errors per subset and the transcription's wall time (offline, the finals' decodes are most of
it; the second pass's own latency figure counts the time a final queued, so it is not
printed).
Refined partials stay greedy whatever the beam; this is the finals' decode only.

    python bench/stress_set.py --out /tmp/oasr-stress
    python bench/read_passages.py --out /tmp/passages
    python bench/final_beam.py --stress /tmp/oasr-stress --passages /tmp/passages
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from final_context import error_counts, load_items, per_subset, run
from second_pass_parity import add_stress_argument, engine_config

from oasr.benchmarks.workload import DEVSET_DIR
from oasr.engine import EngineConfig, configure_process
from oasr.engine.second_pass.guard import FirstPassGuard


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 3, 5])
    add_stress_argument(parser)
    parser.add_argument("--passages", type=Path, default=None, help="a read_passages.py directory")
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--subsets", nargs="*", default=None, help="only these subsets")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: a live second-pass process's on two cores)")
    parser.add_argument("--out", type=Path, default=None, help="per-file texts and figures as JSON")
    args = parser.parse_args(argv)
    configure_process(args.threads)
    items = load_items(args.passages, args.stress, args.devset,
                       set(args.subsets) if args.subsets else None)
    decode = EngineConfig().second_pass_decode
    figures = []
    for beam in args.beams:
        name = f"beam{beam}"
        config = engine_config("whisper", replace(decode, beam_size=beam), FirstPassGuard(),
                               args.threads)
        seconds = run(items, config, name)
        total, subsets = error_counts(items, name)
        figures.append({"beam": beam, "word_errors": total.word_errors, "words": total.words,
                        "seconds": round(seconds, 1),
                        "subsets": {k: v.word_errors for k, v in subsets.items()}})
        print(f"{name}: {total.word_errors}/{total.words} word errors ({total.wer:.2f} %) in "
              f"{seconds:.0f} s; {per_subset(subsets)}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(
            {"figures": figures,
             "files": [{"file": i.path.name, "reference": i.reference,
                        **{k: v["text"] for k, v in i.results.items()}} for i in items]},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
