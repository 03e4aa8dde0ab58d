"""Stats are private: counts and ids only, never what anyone said.

Two clients speak real recordings at once (``/ws/asr`` and the realtime socket) to the bundled
model with its Whisper second pass, while a third watches ``/ws/stats``, ``/api/stats`` and
``/metrics``: no string in any snapshot and no line of the metrics holds a word either client
was sent back.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from server_helpers import frames, pool_is_full, wait_until
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from oasr.audio import read_audio
from oasr.decoding import EndpointConfig

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def pcm_of(path: Path) -> bytes:
    return (read_audio(path) * 32767).astype("<i2").tobytes()


def strings(value: Any) -> list[str]:
    """Every string value (not key) anywhere in a JSON document."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def asr_texts(client: TestClient, pcm: bytes) -> list[str]:
    texts = []
    with client.websocket_connect("/ws/asr") as ws:
        for frame in frames(pcm):
            ws.send_bytes(frame)
        ws.send_json({"type": "end"})
        while True:
            try:
                message = ws.receive_json()
            except WebSocketDisconnect:
                return texts
            texts.append(message.get("text", ""))


def realtime_texts(client: TestClient, pcm: bytes) -> list[str]:
    texts = []
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        ws.receive_json()
        ws.send_json({"type": "session.update", "session": {"audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}})
        for piece in frames(pcm, 6400):
            ws.send_json({"type": "input_audio_buffer.append",
                          "audio": base64.b64encode(piece).decode()})
        ws.send_json({"type": "input_audio_buffer.commit"})
        while True:
            event = ws.receive_json()
            texts += [event.get("delta", ""), event.get("transcript", "")]
            if event["type"].endswith("completed"):
                return texts


def test_no_stats_path_carries_transcript_text(
        make_client: Callable[..., TestClient], bundled_model_dir: Path,
        devset_dir: Path) -> None:
    client = make_client(engine={"model": str(bundled_model_dir), "second_pass": "whisper",
                                 "max_num_blocks": 64, "endpoint": EndpointConfig()})
    speech = [pcm_of(devset_dir / "real_george_0.wav"), pcm_of(devset_dir / "real_jfk.wav")]
    snapshots: list[dict[str, Any]] = []
    stop = threading.Event()

    def watch() -> None:
        with client.websocket_connect("/ws/stats") as ws:
            while not stop.is_set():
                snapshots.append(ws.receive_json())
                snapshots.append(client.get("/api/stats").json())

    watcher = threading.Thread(target=watch)
    watcher.start()
    results: dict[str, list[str]] = {}
    talkers = [
        threading.Thread(target=lambda: results.update(asr=asr_texts(client, speech[0]))),
        threading.Thread(target=lambda: results.update(rt=realtime_texts(client, speech[1])))]
    for thread in talkers:
        thread.start()
    for thread in talkers:
        thread.join(120)
    metrics = client.get("/metrics").text
    stop.set()
    watcher.join(10)
    words = {w for texts in results.values() for t in texts for w in t.split() if len(w) >= 4}
    assert len(results) == 2, results
    assert len(results["asr"]) > 3 and "country" in " ".join(results["rt"]).lower(), results
    words = {w.lower().strip(".,") for w in words}
    assert len(snapshots) > 4 and any(s["second_pass"]["num_second_pass_finals"] for s in
                                      snapshots if "second_pass" in s)
    for snapshot in snapshots:
        for value in strings(snapshot):
            assert not any(w in value.lower() for w in words), value
    spoken = [w for w in words if len(w) >= 8]
    assert not any(w in metrics.lower() for w in spoken)
    wait_until(lambda: pool_is_full(client.get("/api/stats").json()), what="pool back to full")
