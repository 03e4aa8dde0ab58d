"""Exhaustion as designed: the per-stream pool ceiling ends a stream with ``length`` and its
transcript so far; full slots refuse ``busy`` (close 1013) or make a stream wait its turn; a
full connection limit refuses at the handshake. Each test runs its own small server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from ws_clients import (
    ClientResult,
    Clip,
    assert_clean_finish,
    offline_results,
    server_flags,
    stream_clip,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CEILING_BLOCKS = 2  # 2 chunks of 640 ms per stream: a 3 s clip cannot fit


async def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"{what} not seen within {timeout_s} s"
        await asyncio.sleep(0.02)


def test_pool_ceiling_ends_streams_with_length_and_their_transcript(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip]) -> None:
    server = checked_server(random_model_dir, *server_flags(
        2, blocks_per_stream=CEILING_BLOCKS, max_wait_s=0.0))
    pair = clips[:2]
    expected = offline_results(random_model_dir, pair, CEILING_BLOCKS)
    assert [r.finish_reason for r in expected] == ["length", "length"]

    async def both() -> list[ClientResult]:
        return list(await asyncio.gather(*(stream_clip(server.ws_url, c.pcm()) for c in pair)))

    results = asyncio.run(both())
    for result, reference in zip(results, expected, strict=True):
        assert result.finish_reason == "length", result.messages
        assert result.close_code == 1000 and not result.errors
        assert result.finals == [s["text"] for s in reference.segments]
        assert any(result.finals), "a stream cut at the ceiling lost its transcript"
    stats = server.wait_until_idle()
    assert stats["finish_reasons"]["length"] == 2


def test_full_slots_refuse_busy_and_a_full_server_refuses_connections(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        references: list[list[str]]) -> None:
    server = checked_server(random_model_dir, *server_flags(
        2, max_wait_s=0.0, extra=("--max-connections", "3")))

    async def scenario() -> tuple[list[ClientResult], ClientResult, ClientResult]:
        holders = [ClientResult(), ClientResult()]
        tasks = [asyncio.create_task(stream_clip(server.ws_url, clips[i].pcm(), result=r))
                 for i, r in enumerate(holders)]
        await wait_for(lambda: all(r.got_ready for r in holders), "both streams ready")
        by_engine = ClientResult()
        async with connect(server.ws_url, open_timeout=30) as third:  # connected, no start yet
            await wait_for(lambda: server.stats()["server"]["connections"] == 3, "3 connections")
            at_door = await stream_clip(server.ws_url, clips[3].pcm())
            await third.send(json.dumps({"type": "start"}))
            with contextlib.suppress(ConnectionClosed):
                async for message in third:
                    by_engine.messages.append(json.loads(message))
        by_engine.close_code = third.close_code
        return list(await asyncio.gather(*tasks)), by_engine, at_door

    holders, by_engine, at_door = asyncio.run(scenario())
    for index, result in enumerate(holders):
        assert_clean_finish(result, references[index], f"slot holder {index}")
    for result in (by_engine, at_door):
        assert [m["type"] for m in result.messages] == ["error"], result.messages
        assert result.errors[0]["code"] == "busy" and result.close_code == 1013
    assert "stream slots" in by_engine.errors[0]["message"]
    assert "connections" in at_door.errors[0]["message"]
    assert server.wait_until_idle()["num_refused"] == 1


def test_a_stream_waits_for_a_slot_then_runs_exactly(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        references: list[list[str]]) -> None:
    server = checked_server(random_model_dir, *server_flags(1, max_wait_s=30.0))

    async def scenario() -> tuple[ClientResult, ClientResult]:
        first = ClientResult()
        first_task = asyncio.create_task(stream_clip(server.ws_url, clips[0].pcm(), result=first))
        await wait_for(lambda: first.got_ready, "the first stream ready")
        second = await stream_clip(server.ws_url, clips[1].pcm(), realtime=False)
        return await first_task, second

    first, second = asyncio.run(scenario())
    assert_clean_finish(first, references[0], "first stream")
    assert_clean_finish(second, references[1], "waiting stream")
    assert second.time_of("ready") >= first.time_of("done"), "two streams shared one slot"
