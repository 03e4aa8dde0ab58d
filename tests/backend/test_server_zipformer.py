"""The server with an icefall Zipformer experiment dir: the same protocol on the slot runtime
(no paged blocks), the model's 320 ms chunk, every slot back after the stream."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from server_helpers import synthetic_pcm, wait_until
from starlette.testclient import TestClient
from support.paths import ZIPFORMER_FIXTURE_DIR
from test_server_asr_socket import collect, stats, stream_file

pytestmark = pytest.mark.timeout(120)


def test_websocket_stream_with_an_icefall_zipformer(make_client: Callable[..., TestClient]) -> None:
    client = make_client(engine={"model": str(ZIPFORMER_FIXTURE_DIR)})
    seconds = 3.0
    with client.websocket_connect("/ws/asr") as ws:
        stream_file(ws, synthetic_pcm(seconds), {"type": "start", "sample_rate": 16000})
        messages, code = collect(ws)
    assert code == 1000
    assert messages[0]["type"] == "ready" and messages[0]["chunk_ms"] == 320
    assert messages[-1]["type"] == "done" and messages[-1]["finish_reason"] == "stop"
    finals = [m for m in messages if m["type"] == "final"]
    assert finals and any(f["text"] for f in finals), messages
    assert all(0 <= f["start"] <= f["end"] <= seconds + 0.5 for f in finals)

    def slots_back() -> bool:
        pool = stats(client)["pool"]
        return pool["kind"] == "slots" and pool["num_used_slots"] == 0
    wait_until(slots_back, what="every slot back")
    snapshot = stats(client)
    assert snapshot["pool"]["num_blocks"] == 0 and snapshot["model"]["family"] == "zipformer"
