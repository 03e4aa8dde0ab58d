"""A clone runs its tests with nothing beside it: the data the tests read is in ``tests/data``, no
Python file reaches for a folder outside the repository, and no test imports a conftest (which
breaks as soon as two test folders are collected together)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.paths import DEVSET_DIR, REPO_ROOT, WENET_FIXTURE_DIR, ZIPFORMER_FIXTURE_DIR

SOURCE_DIRS = ("oasr", "backend", "bench", "recipes", "tests")
_PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]")
_OUTSIDE = re.compile(r"""/ "shared"|["'/]shared/(?:audio|fixtures)|/work/shared|\.\./shared""")
_CONFTEST_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:[\w.]+\.)?conftest\b", re.M)


def _python_files() -> list[Path]:
    return sorted(f for d in SOURCE_DIRS for f in (REPO_ROOT / d).rglob("*.py")
                  if "__pycache__" not in f.parts)


def test_the_source_tree_is_found() -> None:
    files = _python_files()
    assert len(files) > 100 and REPO_ROOT / "tests" / "test_self_contained.py" in files


def test_no_python_file_reaches_outside_the_repository() -> None:
    problems = []
    for f in _python_files():
        text = f.read_text(encoding="utf-8")
        root_index = len(f.relative_to(REPO_ROOT).parts) - 1  # parents[root_index]: the root
        problems += [f"{f.relative_to(REPO_ROOT)}: parents[{n}] is above the repository"
                     for n in map(int, _PARENTS.findall(text)) if n > root_index]
        if f.name != "test_self_contained.py":  # its patterns name what they look for
            problems += [f"{f.relative_to(REPO_ROOT)}: {m.group(0)!r} names a folder beside it"
                         for m in _OUTSIDE.finditer(text)]
    assert not problems, "\n".join(problems)


def test_no_test_imports_a_conftest() -> None:
    offenders = [str(f.relative_to(REPO_ROOT)) for f in _python_files()
                 if f.name != "test_self_contained.py"
                 and _CONFTEST_IMPORT.search(f.read_text(encoding="utf-8"))]
    assert not offenders, f"import from tests/support instead: {offenders}"


def test_every_devset_file_in_the_manifest_is_there() -> None:
    rows = [line.split("\t") for line in
            (DEVSET_DIR / "manifest.tsv").read_text(encoding="utf-8").splitlines() if line]
    assert len(rows) == 30 and all(len(row) == 2 and row[1].strip() for row in rows)
    wavs = {str(f.relative_to(DEVSET_DIR)) for f in DEVSET_DIR.rglob("*.wav")}
    assert {name for name, _ in rows} == wavs and "e2e/hello_48k.wav" in wavs
    assert (DEVSET_DIR / "LICENSES.md").is_file()


@pytest.mark.parametrize(("folder", "names"), [
    (WENET_FIXTURE_DIR, ("README.md", "config.json", "train.yaml", "global_cmvn.json",
                         "state_dict_fp16.pt", "reference_outputs.npz", "report.json")),
    (ZIPFORMER_FIXTURE_DIR, ("README.md", "train_args.json", "tokens.txt", "pretrained.pt",
                             "reference_outputs.npz")),
])
def test_each_fixture_has_its_files_and_its_note(folder: Path, names: tuple[str, ...]) -> None:
    assert sorted(f.name for f in folder.iterdir()) == sorted(names)
