"""bench/refine_commits.py's summary: word errors of the forced and free finals, and what a
reader saw while each segment was open (stable words at all, when first, their share)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from support.bench_scripts import load_bench_script


def segment(bench: Any, subset: str, forced: str, trace: list[tuple[float, int, int]],
            committed: str = "") -> Any:
    request = SimpleNamespace(refine=SimpleNamespace(
        agreement=SimpleNamespace(committed=committed.split())))
    return bench.Segment("s", subset, np.zeros(0, np.float32), "the cat sat on the mat",
                         request=request, trace=trace,
                         texts={"forced": forced, "free": "the cat sat on the mat"})


def test_summary_counts_errors_and_when_words_became_stable() -> None:
    bench = load_bench_script("refine_commits")
    rows = bench.summarise([
        # committed "the cat" at its second refinement (2 s), a wrong word forced into the final
        segment(bench, "a", "the cat sat on a mat", [(1.0, 0, 2), (2.0, 2, 4), (3.0, 2, 4)],
                committed="the cat"),
        # nothing ever committed
        segment(bench, "a", "the cat sat on the mat", [(1.0, 0, 3), (2.0, 0, 6)]),
        # committed at once
        segment(bench, "b", "the cat sat on the mat", [(1.0, 3, 3)], committed="the cat sat"),
    ])
    by_subset = {row["subset"]: row for row in rows}
    assert [row["subset"] for row in rows] == ["a", "b", "all"]
    a, everything = by_subset["a"], by_subset["all"]
    assert (a["forced_errors"], a["free_errors"], a["forced_worse"]) == (1, 0, 1)
    assert (a["committed"], a["refinements"], a["with_commits"]) == (2, 5, 1)
    assert a["first_commit_s_p50"] == 2.0
    assert a["stable_share"] == round((0 + 0.5 + 0.5 + 0 + 0) / 5, 3)
    assert everything["with_commits"] == 2
    assert everything["first_commit_s_p50"] == 1.5  # the median of 2 s and 1 s
    assert everything["stable_share"] == round((0 + 0.5 + 0.5 + 0 + 0 + 1) / 6, 3)
    assert by_subset["b"]["forced_worse"] == 0
