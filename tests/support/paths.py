"""Where the tests' data lives: ``tests/data`` inside the repository.

``tests/data/README.md`` says what each folder holds and what reads it; the licence notes sit
beside the files (``audio/devset/LICENSES.md`` and each fixture's ``README.md``).
"""

from __future__ import annotations

from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
DATA_DIR = TESTS_DIR / "data"

DEVSET_DIR = DATA_DIR / "audio" / "devset"
"""28 short English recordings (16 kHz mono WAV) with ``manifest.tsv`` (file TAB transcript),
and ``e2e/hello_48k.wav`` / ``e2e/hello_16k.wav``."""

WENET_FIXTURE_DIR = DATA_DIR / "fixtures" / "wenet"
"""A small random WeNet Conformer-CTC and the outputs WeNet's own code gave for it."""

ZIPFORMER_FIXTURE_DIR = DATA_DIR / "fixtures" / "icefall_zipformer"
"""A small random icefall Zipformer2 experiment directory and icefall's outputs for it."""
