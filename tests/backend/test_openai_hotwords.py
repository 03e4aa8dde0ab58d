"""Hotwords and prompts in the OpenAI APIs: REST ``prompt`` and ``hotwords`` form fields,
realtime ``session.audio.input.transcription.prompt`` / ``hotwords``, and the realtime
``logprobs`` asked for by ``include``."""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from server_helpers import DEFAULT_MODEL_DIR, synthetic_pcm, wav_bytes
from starlette.testclient import TestClient, WebSocketTestSession
from support.paths import DEVSET_DIR

from backend.app import create_app
from backend.config import ServerConfig
from backend.openai_realtime import word_logprobs
from oasr.decoding import GpuDecoderConfig
from oasr.engine import EngineConfig
from oasr.engine.events import Word

pytestmark = pytest.mark.timeout(120)
URL = "/v1/audio/transcriptions"
REALTIME = "/v1/realtime?intent=transcription"


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client(engine={"decoder": GpuDecoderConfig(beam_size=4)})


def post(client: TestClient, data: dict[str, object], file: bytes) -> Any:
    return client.post(URL, data={"model": "whisper-1", **data},
                       files={"file": ("speech.wav", file, "audio/wav")})


@pytest.mark.parametrize("hotwords", ['["Brenvik", {"phrase": "Taloria", "boost": 5}]',
                                      "Brenvik, Taloria"])
def test_rest_takes_hotwords_and_a_prompt(client: TestClient, hotwords: str) -> None:
    response = post(client, {"hotwords": hotwords, "prompt": "Meeting notes."}, wav_bytes(1.0))
    assert response.status_code == 200, response.text
    assert "text" in response.json()


@pytest.mark.parametrize(("data", "param", "words"), [
    ({"hotwords": "[1, 2"}, "hotwords", "not a JSON list"),
    ({"hotwords": '[{"phrase": "a", "boost": 50}]'}, "hotwords", "boost 50"),
    ({"hotwords": ",".join(f"t{i}" for i in range(101))}, "hotwords", "at most 100"),
    ({"hotwords": "R2D2"}, "hotwords", "cannot write '2'"),
    ({"prompt": "x" * 1001}, "prompt", "at most 1000"),
])
def test_rest_refuses_bad_hotwords_naming_the_field(client: TestClient, data: dict[str, str],
                                                    param: str, words: str) -> None:
    response = post(client, data, wav_bytes(1.0))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def _update(ws: WebSocketTestSession, transcription: dict[str, Any],
            include: list[str] | None = None) -> dict[str, Any]:
    session: dict[str, Any] = {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None,
        "transcription": transcription}}}
    if include is not None:
        session["include"] = include
    ws.send_json({"type": "session.update", "session": session})
    return ws.receive_json()


def test_realtime_prompt_and_hotwords_are_echoed(client: TestClient) -> None:
    with client.websocket_connect(REALTIME) as ws:
        ws.receive_json()
        updated = _update(ws, {"prompt": "Names.", "hotwords": [
            "Brenvik", {"phrase": "Taloria", "boost": 4}]},
            include=["item.input_audio_transcription.logprobs"])
        assert updated["type"] == "session.updated", updated
        transcription = updated["session"]["audio"]["input"]["transcription"]
        assert transcription["prompt"] == "Names."
        assert transcription["hotwords"] == [{"phrase": "Brenvik", "boost": 3.0},
                                             {"phrase": "Taloria", "boost": 4.0}]
        assert updated["session"]["include"] == ["item.input_audio_transcription.logprobs"]


@pytest.mark.parametrize(("transcription", "include", "param", "words"), [
    ({"hotwords": "Brenvik"}, None, "session.audio.input.transcription.hotwords",
     "must be a list"),
    ({"hotwords": ["R2D2"]}, None, "session.audio.input.transcription.hotwords",
     "cannot write '2'"),
    ({"prompt": 3}, None, "session.audio.input.transcription.prompt", "must be a string"),
    ({}, ["item.input_audio_transcription.avg_logprob"], "session.include",
     "can include only"),
])
def test_realtime_bad_hotwords_are_an_error_and_the_session_goes_on(
        client: TestClient, transcription: dict[str, Any], include: list[str] | None,
        param: str, words: str) -> None:
    with client.websocket_connect(REALTIME) as ws:
        ws.receive_json()
        event = _update(ws, transcription, include)
        assert event["type"] == "error", event
        assert event["error"]["param"] == param and words in event["error"]["message"]
        assert _update(ws, {"hotwords": ["Brenvik"]})["type"] == "session.updated"


def test_realtime_completed_carries_logprobs_when_included(client: TestClient) -> None:
    with client.websocket_connect(REALTIME) as ws:
        ws.receive_json()
        _update(ws, {"hotwords": ["Brenvik"]}, include=["item.input_audio_transcription.logprobs"])
        pcm = synthetic_pcm(1.5)
        for i in range(0, len(pcm), 9600):
            ws.send_json({"type": "input_audio_buffer.append",
                          "audio": base64.b64encode(pcm[i:i + 9600]).decode()})
        ws.send_json({"type": "input_audio_buffer.commit"})
        while True:
            event = ws.receive_json()
            if event["type"].endswith("transcription.completed"):
                break
        assert isinstance(event["logprobs"], list)
        assert len(event["logprobs"]) == len(event["transcript"].split())


def test_logprobs_are_openais_shape_one_per_word() -> None:
    words = [Word("Hello,", 0.1, 0.4, 0.9), Word("Zoë", 0.5, 0.9, 0.25)]
    entries = word_logprobs(words)
    assert [e["token"] for e in entries] == ["Hello,", " Zoë"]
    assert entries[0]["logprob"] == pytest.approx(math.log(0.9), abs=1e-4)
    assert entries[1]["bytes"] == list(" Zoë".encode())
    assert word_logprobs([Word("x", 0, 0, 0.0)])[0]["logprob"] < -10  # never -inf


@pytest.fixture
def real_client() -> Iterator[TestClient]:
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("no bundled model")
    engine = EngineConfig(device="cpu", max_batch_size=2, max_num_blocks=2 * 64,
                          second_pass="none", refine=None, decoder=GpuDecoderConfig(beam_size=16))
    config = ServerConfig(engine=engine, stats_interval_s=0.05, replica="",
                          allowed_hosts=("testserver",))
    with TestClient(create_app(config)) as client:
        yield client


@pytest.mark.slow
def test_rest_hotwords_change_what_the_first_pass_writes(real_client: TestClient) -> None:
    audio = (DEVSET_DIR / "real_sense_and_sensibility_01_austen_64kb-0870.wav").read_bytes()
    plain = post(real_client, {}, audio).json()["text"]
    biased = post(real_client, {"hotwords": "Dashwood"}, audio).json()["text"]
    assert "dashwood" not in plain.split() and "dashwood" in biased.split()
