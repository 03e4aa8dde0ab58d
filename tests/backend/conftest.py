"""Fixtures for the backend tests: a tiny random model and apps built around real engines."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from server_helpers import CHAR_UNITS

with warnings.catch_warnings():
    # Starlette >= 1.x warns once, at import, when its test client runs on httpx instead of
    # httpx2; the client works the same on both.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from backend.app import create_app
from backend.config import ServerConfig
from oasr.engine import EngineConfig
from oasr.models import AsrModel, ConformerConfig, save_model

# A tiny pool: 2 slots x 8 blocks (8 chunks of 640 ms = 5.1 s of audio per stream). A random
# model's blanks fall anywhere, so endpointing is off here (segments would end at random);
# tests that want it pass engine={"endpoint": EndpointConfig()}.
TEST_ENGINE = {"device": "cpu", "max_batch_size": 2, "max_num_blocks": 16,
               "max_wait_time_s": 0.0, "endpoint": None}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-block, 32-dim random Conformer-CTC in oasr's format (transcripts are noise)."""
    torch.manual_seed(0)
    config = ConformerConfig(vocab_size=len(CHAR_UNITS), output_size=32, attention_heads=2,
                             linear_units=64, num_blocks=2)
    return save_model(AsrModel(config, units=CHAR_UNITS).eval(),
                      tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def blank_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its CTC head pushed to blank: every frame is silence to it."""
    torch.manual_seed(0)
    config = ConformerConfig(vocab_size=len(CHAR_UNITS), output_size=32, attention_heads=2,
                             linear_units=64, num_blocks=2)
    model = AsrModel(config, units=CHAR_UNITS).eval()
    with torch.no_grad():
        model.ctc.ctc_lo.bias[config.ctc_blank_id] = 100.0
    return save_model(model, tmp_path_factory.mktemp("blank_model"))


@pytest.fixture
def make_config(tiny_model_dir: Path) -> Callable[..., ServerConfig]:
    """ServerConfig for the tiny model; ``engine={...}`` overrides EngineConfig fields."""

    def make(engine: dict[str, Any] | None = None, **server: Any) -> ServerConfig:
        engine_config = EngineConfig(
            **{"model": str(tiny_model_dir), **TEST_ENGINE, **(engine or {})})
        server.setdefault("stats_interval_s", 0.05)
        server.setdefault("replica", "")  # unlabelled metrics (test_server_http checks labels)
        # TestClient sends Host: testserver; uvicorn-served tests use 127.0.0.1
        server.setdefault("allowed_hosts", ("testserver", "127.0.0.1", "localhost"))
        return ServerConfig(engine=engine_config, **server)

    return make


@pytest.fixture
def make_client(make_config: Callable[..., ServerConfig]) -> Iterator[Callable[..., TestClient]]:
    """Start an app (lifespan included: engine thread running) per call; all stop at teardown."""
    clients: list[TestClient] = []

    def make(engine: dict[str, Any] | None = None, **server: Any) -> TestClient:
        client = TestClient(create_app(make_config(engine, **server)))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in reversed(clients):
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()
