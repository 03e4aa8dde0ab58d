"""The server with a Whisper-CTC model dir: the same protocol, the model's own chunk and frame
timing, the pool back to full; and the real ``oasr-server --model DIR`` command."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from server_helpers import frames, synthetic_pcm, wait_until
from starlette.testclient import TestClient
from test_server_asr_socket import collect, pool_is_full, stats, stream_file
from websockets.sync.client import connect

from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel, save_whisper_ctc

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Whisper-CTC (2 blocks of width 32, the default 640 ms chunk)."""
    torch.manual_seed(0)
    model = WhisperCtcModel(WhisperCtcConfig(width=32, heads=2, layers=2)).eval()
    return save_whisper_ctc(model, tmp_path_factory.mktemp("wctc"))


def test_websocket_stream_with_a_whisper_ctc_model(make_client: Callable[..., TestClient],
                                                   whisper_dir: Path) -> None:
    client = make_client(engine={"model": str(whisper_dir)})
    seconds = 3.0
    with client.websocket_connect("/ws/asr") as ws:
        stream_file(ws, synthetic_pcm(seconds), {"type": "start", "sample_rate": 16000})
        messages, code = collect(ws)
    assert code == 1000
    assert messages[0]["type"] == "ready" and messages[0]["chunk_ms"] == 640
    assert messages[-1]["type"] == "done" and messages[-1]["finish_reason"] == "stop"
    finals = [m for m in messages if m["type"] == "final"]
    assert finals, "a random model says something in 3 s"
    assert all(0 <= f["start"] <= f["end"] <= seconds + 0.02 for f in finals)
    wait_until(lambda: pool_is_full(client), what="pool back to full")
    model = stats(client)["model"]
    assert model["family"] == "whisper_ctc" and model["chunk_ms"] == 640


def test_oasr_server_command_serves_a_whisper_ctc_dir(start_server: Callable[..., Any],
                                                      whisper_dir: Path) -> None:
    server = start_server(whisper_dir, "--max-batch-size", "2")
    assert server.stats()["model"]["family"] == "whisper_ctc"
    messages: list[dict[str, Any]] = []
    with connect(server.ws_url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "start", "sample_rate": 16000, "format": "s16le"}))
        for frame in frames(synthetic_pcm(2.0)):
            ws.send(frame)
        ws.send(json.dumps({"type": "end"}))
        while not messages or messages[-1]["type"] not in ("done", "error"):
            messages.append(json.loads(ws.recv(timeout=60)))
    assert messages[0]["type"] == "ready"
    assert messages[-1] == {"type": "done", "finish_reason": "stop",
                            "segments": sum(m["type"] == "final" for m in messages)}
    server.wait_until_idle()
