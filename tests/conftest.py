"""Fixtures shared by the end-to-end and reliability suites: a real ``oasr-server`` process.

``start_server(model_dir, *flags)`` runs the ``oasr-server`` command line (uvicorn, the engine
thread, the page) in a child process on 127.0.0.1 with ``--port 0``, reads the port the server
prints once it is ready, and stops every server it started when the test (or module) ends (the
process handling lives in ``support/servers.py``). ``random_model_dir`` is a seeded random
Conformer-CTC in oasr's format: its transcripts are noise, but the same noise for the same audio,
so exact comparisons work.

This file also puts ``tests/`` on ``sys.path`` (pytest's default import mode does it too), so the
shared helpers in ``tests/support/`` import as ``support.<module>`` from every test folder.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from support.paths import DEVSET_DIR, REPO_ROOT  # noqa: E402
from support.servers import StartServer, server_factory  # noqa: E402

from oasr.models import AsrModel, ConformerConfig, save_model  # noqa: E402

BUNDLED_MODEL_DIR = REPO_ROOT / "oasr" / "assets" / "default_model"
RANDOM_MODEL_UNITS = ["<blank>", "<unk>", "'", *"abcdefghijklmnopqrstuvwxyz", "\u2581",
                      "<sos/eos>"]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start ``oasr-server`` processes for one test; all are stopped at its end."""
    yield from server_factory(tmp_path)


@pytest.fixture(scope="module")
def start_module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartServer]:
    """Like ``start_server``, but the servers live as long as the test module."""
    yield from server_factory(tmp_path_factory.mktemp("servers"))


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded random 2-block, 32-dim Conformer-CTC over characters, in oasr's format."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(1234)
    config = ConformerConfig(vocab_size=len(RANDOM_MODEL_UNITS), output_size=32,
                             attention_heads=2, linear_units=64, num_blocks=2,
                             cnn_module_kernel=7)
    model = AsrModel(config, units=RANDOM_MODEL_UNITS).eval()
    torch.random.set_rng_state(generator_state)
    return save_model(model, tmp_path_factory.mktemp("random_model"))


@pytest.fixture(scope="session")
def bundled_model_dir() -> Path:
    """The trained default model's directory; skips the test when it is not there yet."""
    if not (BUNDLED_MODEL_DIR / "config.json").is_file():
        pytest.skip(f"the bundled default model is missing ({BUNDLED_MODEL_DIR}/config.json): "
                    "accuracy checks need the trained model, a random one only checks mechanics")
    return BUNDLED_MODEL_DIR


@pytest.fixture(scope="session")
def devset_dir() -> Path:
    """The developer audio set in ``tests/data`` (manifest.tsv, 16 kHz wavs, e2e/hello_48k.wav)."""
    return DEVSET_DIR
