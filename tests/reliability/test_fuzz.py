"""Malformed input from hypothesis: bytes, text, JSON, message order and sizes.

Each example is one websocket client that sends a generated sequence of messages, then ``end``
(unless it vanished), and waits for the server to close. Whatever it sent, it must get an
error message with the close code the protocol names for it, or ``done`` and a normal close,
or (for frames beyond the transport's limit) a bare 1009, which the client may see as a
dropped connection (1006) while it is still writing; never a hang, never 1011. A message after
``end`` gets one error and costs nothing: the stream's done still follows. After all examples
the server is healthy, idle and has logged no traceback.
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from ws_clients import ERROR_CLOSE_CODES, ClientResult, assert_server_clean, server_flags

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MAX_FRAME_BYTES = 256 * 1024  # ServerConfig's default
MAX_TEXT_BYTES = 4096
TRANSPORT_MAX_BYTES = 4 * MAX_FRAME_BYTES  # backend.server: uvicorn's own frame limit
SETTLE_S = 0.05  # after each message, time for the server's answer to arrive
REPLY_TIMEOUT_S = 30.0
ACCEPTABLE_CLOSE_CODES = {1000, 1003, 1008, 1009, 1013}
KNOWN_TYPES = {"ready", "partial", "final", "done", "error"}
AFTER_END_REFUSAL = "the stream's final and done follow"

Action = tuple[str, Any]


@pytest.fixture(scope="module")
def server(start_module_server: Callable[..., Any], random_model_dir: Path) -> Any:
    return start_module_server(random_model_dir, *server_flags(4, max_wait_s=5.0))


@pytest.fixture(autouse=True)
def server_left_clean(server: Any) -> Any:
    yield
    assert_server_clean(server)


def speech_like_frame(num_samples: int) -> bytes:
    """A 16 kHz s16le frame of a loud tone (valid audio in the default format)."""
    return b"".join(struct.pack("<h", int(8000 * math.sin(i * 0.3))) for i in range(num_samples))


_TEXT = st.text(st.characters(codec="utf-8"), max_size=300)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
_RATES = (st.sampled_from([8000, 16000, 44100, 48000]) | st.integers(-10, 10**9) | st.floats()
          | st.text(max_size=6) | st.none())
_FORMATS = st.sampled_from(["s16le", "f32le", "mp3", "", "S16LE"]) | st.text(max_size=6)
_START = (st.fixed_dictionaries({"type": st.just("start")},
                                optional={"sample_rate": _RATES, "format": _FORMATS})
          | st.fixed_dictionaries({"type": st.just("start"), "extra": _JSON}))
_CONTROL = st.one_of(_START, st.just({"type": "end"}),
                     st.fixed_dictionaries({"type": st.text(max_size=8)}), _JSON)
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("text"), _TEXT),
    st.tuples(st.just("json"), _CONTROL),
    st.tuples(st.just("bytes"), st.binary(max_size=3000)),
    st.tuples(st.just("audio"), st.integers(1, 4000)),
    st.tuples(st.just("floats"), st.lists(st.floats(width=32), min_size=1, max_size=200)),
    st.tuples(st.just("big_bytes"), st.sampled_from(
        [MAX_FRAME_BYTES + 1, 3 * MAX_FRAME_BYTES, 5 * MAX_FRAME_BYTES])),
    st.tuples(st.just("big_text"), st.integers(MAX_TEXT_BYTES + 1, 6 * MAX_TEXT_BYTES)),
), max_size=8)
VANISH: Action = ("vanish", None)
NEVER = 99  # a vanish_at past any sequence: the client does not vanish
VANISH_AT = st.sampled_from([NEVER] * 40 + list(range(8)))  # about one client in six vanishes


def encode(action: Action) -> str | bytes | None:
    """The websocket message for one action (None: vanish)."""
    kind, arg = action
    if kind == "text":
        return arg
    if kind == "json":
        return json.dumps(arg)  # NaN / Infinity literals included: the server's JSON accepts them
    if kind == "bytes":
        return arg
    if kind == "audio":
        return speech_like_frame(arg)
    if kind == "floats":
        return struct.pack(f"<{len(arg)}f", *arg)
    if kind == "big_bytes":
        return bytes(arg)
    if kind == "big_text":
        return json.dumps({"type": "start", "pad": "x" * arg})
    return None


async def run_client(url: str, actions: list[Action]) -> tuple[ClientResult, bool]:
    """Send the actions, then ``end``; collect every message until the server closes.

    Returns:
        What the client saw, and whether it sent a frame beyond the transport's limit.
    """
    result = ClientResult()
    beyond_transport_limit = False
    async with connect(url, max_size=2**22, open_timeout=30, close_timeout=5) as ws:
        async def receive() -> None:
            try:
                async for message in ws:
                    result.messages.append(json.loads(message))
            except ConnectionClosed:
                pass

        receiver = asyncio.create_task(receive())
        for action in [*actions, ("json", {"type": "end"})]:
            message = encode(action)
            if message is None:
                receiver.cancel()
                ws.transport.abort()
                result.vanished = True
                return result, beyond_transport_limit
            if receiver.done():
                break
            beyond_transport_limit |= len(message) > TRANSPORT_MAX_BYTES
            try:
                await ws.send(message)
            except ConnectionClosed:
                break
            await asyncio.wait({receiver}, timeout=SETTLE_S)
        await asyncio.wait_for(receiver, REPLY_TIMEOUT_S)
    result.close_code = ws.close_code
    return result, beyond_transport_limit


def check_reply(result: ClientResult, beyond_transport_limit: bool) -> None:
    if result.vanished:
        return
    if beyond_transport_limit and result.close_code == 1006 and not result.messages:
        return  # the transport refused the frame (1009) and reset while the client wrote
    assert result.close_code in ACCEPTABLE_CLOSE_CODES, (
        f"close code {result.close_code}; messages {result.messages}")
    for message in result.messages:
        assert isinstance(message, dict) and message.get("type") in KNOWN_TYPES, message
    if not result.messages or result.messages[-1]["type"] not in ("error", "done"):
        assert result.close_code == 1009, (  # only the transport's own size limit is silent
            f"closed {result.close_code} with no error and no done: {result.messages}")
        return
    last = result.messages[-1]
    # a message refused after `end` is answered with an error and the stream goes on to done
    after_end = [m for m in result.messages if m["type"] == "error"
                 and m["message"].endswith(AFTER_END_REFUSAL)]
    assert len(after_end) <= 1, f"more than one refusal after end: {result.messages}"
    assert not after_end or last["type"] == "done", f"refused after end, no done: {result.messages}"
    terminal = [m for m in result.messages if m["type"] in ("error", "done") and m not in after_end]
    assert terminal == [last], f"messages after the terminal one: {result.messages}"
    if last["type"] == "done":
        assert result.close_code == 1000, f"done, then close {result.close_code}"
    else:
        assert isinstance(last.get("message"), str) and last["message"], last
        expected = ERROR_CLOSE_CODES.get(last["code"], 1011)
        assert result.close_code == expected, f"error {last}, then close {result.close_code}"


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(actions=ACTIONS, vanish_at=VANISH_AT)
# Named cases of bad input, always run: audio after end, a second start, start after audio,
# NaN / inf floats, an absurd sample rate, JSON that is not an object and an unknown type, a
# frame over our limit, a frame over the transport's limit, a client vanishing mid-stream.
@example(actions=[("json", {"type": "start"}), ("audio", 1600), ("json", {"type": "end"}),
                  ("audio", 1600)], vanish_at=NEVER)
@example(actions=[("json", {"type": "start"}), ("json", {"type": "start"})], vanish_at=NEVER)
@example(actions=[("audio", 1600), ("json", {"type": "start"})], vanish_at=NEVER)
@example(actions=[("json", {"type": "start", "format": "f32le"}),
                  ("floats", [0.1, math.nan, math.inf])], vanish_at=NEVER)
@example(actions=[("json", {"type": "start", "sample_rate": 10**9})], vanish_at=NEVER)
@example(actions=[("json", [1, 2]), ("json", {"type": "hello"})], vanish_at=NEVER)
@example(actions=[("json", {"type": "start"}), ("big_bytes", MAX_FRAME_BYTES + 1)],
         vanish_at=NEVER)
@example(actions=[("big_bytes", 5 * MAX_FRAME_BYTES)], vanish_at=NEVER)
@example(actions=[("json", {"type": "start"}), ("audio", 1600)], vanish_at=2)
def test_malformed_input_gets_an_error_or_a_close(server: Any, actions: list[Action],
                                                  vanish_at: int) -> None:
    if vanish_at <= len(actions):
        actions = [*actions[:vanish_at], VANISH]
    result, beyond_transport_limit = asyncio.run(run_client(server.ws_url, actions))
    check_reply(result, beyond_transport_limit)
    assert server.is_running(), server.log_tail()
