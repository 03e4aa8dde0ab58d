"""Before / after: the quick benchmark of two git revisions, alternated round by round.

On a shared, noisy machine two runs minutes apart see different loads; alternating the two
revisions (before, after, before, after, ...) lets every round's pair see about the same load,
and the medians over rounds are what to compare.

    nice -n 15 python bench/compare_revisions.py 512e4ef HEAD --rounds 3
    python bench/compare_revisions.py HEAD~1 HEAD --rounds 3 --threads 2

Each revision is checked out into a temporary git worktree (removed at the end) and runs
``python -m oasr.cli bench --quick --json`` there with its own code, on the same audio, both
decoding alike (``--beam-size``; greedy when one revision's bench knows no other way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from oasr.benchmarks.workload import DEVSET_DIR

ROOT = Path(__file__).resolve().parents[1]
HEADLINES = ("speedup_batched_vs_sequential", "max_realtime_streams", "gflops_fraction_of_peak")
# headline figures older revisions' reports may lack
OPTIONAL = ("realtime_share_of_ceiling", "gemm_share")
LEFT4 = "paged_cost_ratio_late_vs_chunk10_left4"  # older revisions: only the chunk-200 key
LEFT4_OLD = "paged_cost_ratio_chunk200_vs_chunk10_left4"


def chooses_beam(tree: Path) -> bool:
    """Whether the code in ``tree`` has ``oasr bench --beam-size`` (older revisions' bench
    decodes greedy, whatever the server does)."""
    runner = tree / "oasr" / "benchmarks" / "runner.py"
    return runner.is_file() and '"--beam-size"' in runner.read_text()


def beam_flags(trees: list[Path], beam: int | None) -> list[str]:
    """The ``oasr bench`` flags that make every tree decode alike: ``--beam-size`` as asked
    where all trees have it; greedy where one of them has no choice (asking for a beam then
    is an error)."""
    if all(chooses_beam(tree) for tree in trees):
        return [] if beam is None else ["--beam-size", str(beam)]
    if beam not in (None, 1):
        raise SystemExit(f"a revision's bench decodes greedy only: compare with --beam-size 1, "
                         f"not {beam}")
    return ["--beam-size", "1"]


def run_quick(tree: Path, audio_dir: Path, threads: int, extra: list[str]) -> dict:
    """One quick benchmark of the code in ``tree`` on ``threads`` threads: its JSON result.
    ``extra``: more flags (`beam_flags`), passed where the tree's bench has them."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OASR_BENCH_AUDIO": str(audio_dir)}
    flags = extra if chooses_beam(tree) else []
    proc = subprocess.run([sys.executable, "-m", "oasr.cli", "bench", "--quick", "--json",
                           "--threads", str(threads), *flags],
                          cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(result: dict) -> dict[str, float]:
    """The headline numbers plus the 64-stream step times and the batched forward's ms."""
    row = result["throughput"][0]
    headline = result["headline"]
    return {**{k: float(headline[k]) for k in HEADLINES},
            **{k: float(headline[k]) for k in OPTIONAL if headline.get(k) is not None},
            "paged_cost_ratio_late_vs_chunk10_left4": float(headline.get(LEFT4,
                                                                         headline[LEFT4_OLD])),
            "engine_step_ms": row["engine_step_ms"], "dense_step_ms": row["dense_step_ms"],
            "forward_ms": result["compute"]["step_ms"],
            "load": result["machine"]["load_average_1min_at_start"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--audio-dir", type=Path, default=DEVSET_DIR)
    p.add_argument("--threads", type=int, default=1, help="the quick benchmark's --threads")
    p.add_argument("--json", type=Path, default=None, help="write every round's numbers here")
    p.add_argument("--beam-size", type=int, default=None,
                   help="the quick benchmark's CTC beam (default: the server's); a revision "
                        "whose bench has no such flag decodes greedy, and then both do")
    args = p.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for name in runs:
            trees[name] = Path(tmp) / name
            subprocess.run(["git", "worktree", "add", "--detach", str(trees[name]),
                            getattr(args, name)], cwd=ROOT, check=True, capture_output=True)
        try:
            extra = beam_flags(list(trees.values()), args.beam_size)
            print(f"decoding: {' '.join(extra) or 'the server default'}", flush=True)
            for r in range(args.rounds):
                for name, tree in trees.items():
                    runs[name].append(summary(run_quick(tree, args.audio_dir.resolve(),
                                                        args.threads, extra)))
                    print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                               check=False, capture_output=True)
    print(f"\n| median of {args.rounds} rounds | before ({args.before}) | after ({args.after}) |")
    print("|---|---|---|")
    for key in [k for k in runs["after"][0] if k in runs["before"][0]]:
        b = statistics.median(x[key] for x in runs["before"])
        a = statistics.median(x[key] for x in runs["after"])
        print(f"| {key} | {b:,.2f} | {a:,.2f} |")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
