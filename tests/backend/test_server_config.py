"""ServerConfig validation, the engine config it builds, and the websocket admission rules."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from backend.admission import ConnectionLimiter, is_origin_allowed
from backend.config import ServerConfig
from oasr.engine import EngineConfig


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("port", 70000, "70000"),
    ("max_connections", 0, "max_connections=0"),
    ("max_frame_bytes", 100, "max_frame_bytes=100"),
    ("max_text_bytes", 10, "max_text_bytes=10"),
    ("stats_interval_s", 0.0, "stats_interval_s=0.0"),
    ("allowed_origins", "https://a.example", "tuple"),
    ("host", "", "host"),
])
def test_invalid_values_are_refused_with_the_value(field: str, value: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        ServerConfig(**{field: value})  # type: ignore[arg-type]


def test_a_zero_idle_timeout_is_refused_for_a_server() -> None:
    EngineConfig(idle_timeout_s=0)  # an engine may end idle streams at once (tests do) ...
    with pytest.raises(ValueError, match="idle_timeout_s=0"):  # ... a server may not
        ServerConfig(engine=EngineConfig(idle_timeout_s=0))


def test_session_shorter_than_idle_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="max_session_s=5"):
        ServerConfig(engine=EngineConfig(idle_timeout_s=10, max_session_s=5))


def test_the_timeouts_have_one_owner() -> None:
    """The engine's config holds the stream timeouts; the server has no copy to disagree."""
    assert not {"idle_timeout_s", "max_session_s"} & {f.name for f in fields(ServerConfig)}
    config = ServerConfig(engine=EngineConfig(max_batch_size=3, idle_timeout_s=7,
                                              max_session_s=70))
    assert (config.engine.idle_timeout_s, config.engine.max_session_s) == (7, 70)
    assert ServerConfig().engine.idle_timeout_s == 15.0  # a server's default, not the library's


def test_url_and_static_dir() -> None:
    assert ServerConfig(host="0.0.0.0", port=9000).url == "http://localhost:9000/"
    assert ServerConfig(host="::1", port=8000).url == "http://[::1]:8000/"
    assert (ServerConfig().static_dir / "index.html").is_file()
    assert ServerConfig(static_dir="x").static_dir == Path("x")  # type: ignore[arg-type]


def test_frontend_dir_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OASR_FRONTEND_DIR", str(tmp_path))
    assert ServerConfig().static_dir == tmp_path


@pytest.mark.parametrize(("origin", "host", "allowed", "ok"), [
    (None, "a:8000", (), True),
    ("http://a:8000", "a:8000", (), True),
    ("http://A:8000", "a:8000", (), True),
    ("http://a:8001", "a:8000", (), False),
    ("https://evil.example", "a:8000", (), False),
    ("https://b.example", "a:8000", ("https://b.example/",), True),
    ("https://c.example", "a:8000", ("https://b.example",), False),
    ("https://c.example", "a:8000", ("*",), True),
    ("null", "a:8000", (), False),
])
def test_origin_rules(origin: str | None, host: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert is_origin_allowed(origin, host, allowed) is ok


def test_connection_limiter_counts_and_refuses() -> None:
    limiter = ConnectionLimiter(2)
    assert limiter.try_acquire() and limiter.try_acquire()
    assert not limiter.try_acquire()
    assert limiter.num_connections == 2
    limiter.release()
    assert limiter.try_acquire()
    with pytest.raises(ValueError, match="max_connections=0"):
        ConnectionLimiter(0)
