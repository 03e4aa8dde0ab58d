"""API keys, short-lived page tokens and allowed hosts, through TestClient."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from backend.auth import TokenStore
from backend.config import ServerConfig, api_keys_from_env, default_allowed_hosts

pytestmark = pytest.mark.timeout(60)
KEY = "sk-right"
GOOD = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def keyed(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client(api_keys=(KEY, "sk-other"))


@pytest.mark.parametrize("path", ["/v1/models", "/api/stats", "/metrics"])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-wrong"},
                                     {"Authorization": f"Basic {KEY}"}])
def test_api_routes_need_a_key(keyed: TestClient, path: str, headers: dict[str, str]) -> None:
    response = keyed.get(path, headers=headers)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert keyed.get(path, headers=GOOD).status_code == 200


def test_transcriptions_need_a_key(keyed: TestClient) -> None:
    response = keyed.post("/v1/audio/transcriptions", data={"model": "m"},
                          files={"file": ("a.wav", b"x", "audio/wav")})
    assert response.status_code == 401


def test_health_checks_and_the_page_stay_open(keyed: TestClient) -> None:
    for path in ("/healthz", "/readyz", "/", "/js/main.js"):
        assert keyed.get(path).status_code == 200, path


@pytest.mark.parametrize("path", ["/ws/asr", "/ws/stats", "/v1/realtime?intent=transcription"])
def test_websockets_without_a_key_get_an_error_then_1008(keyed: TestClient, path: str) -> None:
    with keyed.websocket_connect(path, subprotocols=["openai-insecure-api-key.sk-no"]) as ws:
        message = ws.receive_json()
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 1008
    if path.startswith("/v1"):
        assert message["error"]["code"] == "invalid_api_key"
    else:
        assert message["code"] == "unauthorized"


def test_websockets_take_the_bearer_header_or_the_key_subprotocol(keyed: TestClient) -> None:
    url = "/v1/realtime?intent=transcription"
    with keyed.websocket_connect(url, headers=GOOD) as ws:
        assert ws.receive_json()["type"] == "session.created"
    protocols = ["realtime", f"openai-insecure-api-key.{KEY}"]
    with keyed.websocket_connect(url, subprotocols=protocols) as ws:
        assert ws.accepted_subprotocol == "realtime"
        assert ws.receive_json()["type"] == "session.created"
    with keyed.websocket_connect("/ws/stats", subprotocols=protocols[1:]) as ws:
        assert ws.accepted_subprotocol == protocols[1]  # a browser needs one answered
        assert "pool" in ws.receive_json()


def test_a_key_mints_a_token_that_opens_websockets(keyed: TestClient) -> None:
    assert keyed.post("/api/token").status_code == 401
    body = keyed.post("/api/token", headers=GOOD).json()
    token = body["token"]
    assert token.startswith("oasr-tmp-") and body["expires_at"] > 0
    with keyed.websocket_connect("/ws/stats",
                                 subprotocols=[f"openai-insecure-api-key.{token}"]) as ws:
        assert "pool" in ws.receive_json()
    assert keyed.get("/api/stats", headers={"Authorization": f"Bearer {token}"}).is_success
    # a token cannot mint more tokens
    assert keyed.post("/api/token", headers={"Authorization": f"Bearer {token}"}
                      ).status_code == 401


def test_without_keys_the_token_endpoint_says_none_is_needed(client: TestClient) -> None:
    assert client.post("/api/token").json() == {"token": None, "expires_at": None}
    assert client.get("/api/stats").status_code == 200


def test_tokens_expire() -> None:
    now = [1000.0]
    store = TokenStore(60.0, clock=lambda: now[0])
    token, expires_at = store.mint()
    assert expires_at == 1060.0 and store.is_valid(token)
    now[0] = 1060.0
    assert not store.is_valid(token) and not store.is_valid("made-up")
    store.mint()
    assert token not in store._expiry  # expired tokens are dropped when one is minted


@pytest.mark.parametrize("path", ["/api/stats", "/", "/v1/models"])
def test_other_host_headers_get_400(client: TestClient, path: str) -> None:
    response = client.get(path, headers={"host": "attacker.example:8000"})
    assert response.status_code == 400
    assert client.get(path, headers={"host": "localhost:8000"}).status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_answer_any_host(client: TestClient, path: str) -> None:
    """HAProxy's httpchk sends no Host header and kubelet sends the pod's IP."""
    for host in ("attacker.example:8000", "10.1.2.3:8000"):
        assert client.get(path, headers={"host": host}).status_code in (200, 503)
    assert client.get("/api/stats", headers={"host": "10.1.2.3:8000"}).status_code == 400


def test_a_rebound_websocket_is_refused(client: TestClient) -> None:
    headers = {"host": "attacker.example", "origin": "http://attacker.example"}
    with pytest.raises(WebSocketDisconnect), client.websocket_connect(
            "/ws/asr", headers=headers) as ws:
        ws.receive_json()


def test_allowed_host_defaults_and_wildcards(make_client: Callable[..., TestClient]) -> None:
    assert default_allowed_hosts("0.0.0.0") == ("localhost", "127.0.0.1", "[::1]")
    assert default_allowed_hosts("10.1.2.3")[-1] == "10.1.2.3"
    assert default_allowed_hosts("fd00::5")[-1] == "[fd00::5]"
    assert ServerConfig(host="192.168.0.9").allowed_hosts[-1] == "192.168.0.9"
    client = make_client(allowed_hosts=("*.example.com",))
    assert client.get("/v1/models", headers={"host": "asr.example.com"}).status_code == 200
    assert client.get("/v1/models", headers={"host": "example.org"}).status_code == 400


@pytest.mark.parametrize(("field", "value", "words"), [
    ("api_keys", "one-key", "tuple"),
    ("api_keys", ("has space",), "spaces"),
    ("api_keys", ("",), "empty"),
    ("allowed_hosts", ("a*.com",), "wildcard"),
    ("max_upload_bytes", 10, ">= 1024"),
    ("token_ttl_s", 0.0, "1..86400"),
])
def test_config_rejects(field: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ServerConfig(**{field: value})  # type: ignore[arg-type]


def test_api_keys_from_the_environment() -> None:
    assert api_keys_from_env({"OASR_API_KEYS": "a, b c"}) == ("a", "b", "c")
    assert api_keys_from_env({}) == ()
