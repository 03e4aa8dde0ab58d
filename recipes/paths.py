"""Where the recipes keep their data, checkpoints and logs: ``$OASR_DATA`` when set, else
``data/`` at the repository's root (git ignores it; big files never go in git)."""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "OASR_DATA"
DATA_ROOT = Path(os.environ.get(DATA_ENV) or Path(__file__).resolve().parent.parent / "data")
