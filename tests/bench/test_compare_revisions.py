"""bench/compare_revisions.py makes both revisions decode alike: the beam asked for where both
benches can choose it, greedy where one of them cannot."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.bench_scripts import load_bench_script
from support.paths import REPO_ROOT

compare_revisions = load_bench_script("compare_revisions")


def _tree(root: Path, name: str, runner_text: str) -> Path:
    runner = root / name / "oasr" / "benchmarks" / "runner.py"
    runner.parent.mkdir(parents=True)
    runner.write_text(runner_text)
    return root / name


def test_both_decode_alike(tmp_path: Path) -> None:
    new = _tree(tmp_path, "new", (REPO_ROOT / "oasr/benchmarks/runner.py").read_text())
    old = _tree(tmp_path, "old", 'p.add_argument("--steps", type=int)\n')
    assert compare_revisions.chooses_beam(new) and not compare_revisions.chooses_beam(old)
    assert compare_revisions.beam_flags([new, new], None) == []  # the server's, both
    assert compare_revisions.beam_flags([new, new], 4) == ["--beam-size", "4"]
    # an old bench decodes greedy: the new one is told to as well
    assert compare_revisions.beam_flags([old, new], None) == ["--beam-size", "1"]
    assert compare_revisions.beam_flags([old, new], 1) == ["--beam-size", "1"]
    with pytest.raises(SystemExit, match="compare with --beam-size 1"):
        compare_revisions.beam_flags([old, new], 16)
