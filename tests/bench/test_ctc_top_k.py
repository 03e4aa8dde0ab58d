"""bench/ctc_top_k.py: one tiny run over two devset files, every figure reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support.bench_scripts import load_bench_script
from support.paths import REPO_ROOT

DEVSET = REPO_ROOT / "tests" / "data" / "audio" / "devset"
FILES = ("real_george_0.wav", "tts_00.wav")


def test_a_tiny_run_scores_each_value_against_the_references_and_the_first(
        tmp_path: Path) -> None:
    devset = tmp_path / "devset"
    devset.mkdir()
    lines = [line for line in (DEVSET / "manifest.tsv").read_text().splitlines()
             if line.split("\t")[0] in FILES]
    (devset / "manifest.tsv").write_text("\n".join(lines) + "\n")
    for name in FILES:
        shutil.copy(DEVSET / name, devset / name)
    out = tmp_path / "out.json"
    script = load_bench_script("ctc_top_k")
    assert script.main(["--devset", str(devset), "--top-k", "33", "1", "--streams", "2",
                        "--rounds", "1", "--threads", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    exact, narrow = result["texts"]
    references = [line.split("\t")[1] for line in lines]
    assert exact["top_k"] == 33 and narrow["top_k"] == 1
    for row in (exact, narrow):
        assert row["words"] == sum(len(r.split()) for r in references)
        assert row["word_errors"] >= 0 and row["transcribe_s"] > 0
    assert exact["texts_differing"] == exact["words_apart"] == 0  # the first against itself
    assert narrow["texts_differing"] <= 2
    assert (narrow["words_apart"] == 0) == (narrow["texts_differing"] == 0)
    assert set(result["search_ms"]) == {"2"}
    assert set(result["search_ms"]["2"]) == {"33", "1"}
    assert all(ms > 0 for ms in result["search_ms"]["2"].values())
