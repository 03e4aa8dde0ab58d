"""The recipes' data root: ``$OASR_DATA``, else the repository's git-ignored ``data/``; the
stages' defaults follow it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHOW = ("from recipes.paths import DATA_ROOT; from recipes.conformer import train; "
        "from recipes.whisper_ctc import feats; print(DATA_ROOT); print(feats.DEFAULT_OUT)")


def _show(env_value: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "OASR_DATA"}
    if env_value is not None:
        env["OASR_DATA"] = env_value
    done = subprocess.run([sys.executable, "-c", SHOW], cwd=REPO, env=env, capture_output=True,
                          text=True, check=True)
    return done.stdout.split()


def test_the_data_root_is_the_repositorys_ignored_data_folder_by_default() -> None:
    root, feats = _show(None)
    assert Path(root) == REPO / "data"
    assert Path(feats) == REPO / "data" / "wctc" / "feats"
    if (REPO / ".git").exists():  # a checkout: git ignores what the recipes write there
        ignored = subprocess.run(["git", "check-ignore", "-q", "data/x"], cwd=REPO)
        assert ignored.returncode == 0


def test_oasr_data_moves_every_default(tmp_path: Path) -> None:
    root, feats = _show(str(tmp_path))
    assert Path(root) == tmp_path
    assert Path(feats) == tmp_path / "wctc" / "feats"
