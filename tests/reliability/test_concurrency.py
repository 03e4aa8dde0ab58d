"""Many real-time clients at once, and clients that vanish mid-utterance, on one server.

The server runs the random model in a child process; each clip's segments must equal what the
same model gives offline (``transcribe_files``), whatever else happens on the server.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ws_clients import (
    ClientResult,
    Clip,
    assert_clean_finish,
    assert_server_clean,
    server_flags,
    stream_clip,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NUM_CLIENTS = 32
STATS_POLL_S = 0.2


@pytest.fixture(scope="module")
def server(start_module_server: Callable[..., Any], random_model_dir: Path) -> Any:
    return start_module_server(random_model_dir,
                               *server_flags(NUM_CLIENTS, extra=("--max-connections", "64")))


@pytest.fixture(autouse=True)
def server_left_clean(server: Any) -> Any:
    yield
    assert_server_clean(server)


async def run_with_stats(server: Any, clients: list[Any]) -> tuple[list[ClientResult], int]:
    """Run the client coroutines together; returns their results and the peak active streams."""
    tasks = [asyncio.create_task(client) for client in clients]
    peak_active = 0
    while not all(task.done() for task in tasks):
        stats = await asyncio.to_thread(server.stats)
        peak_active = max(peak_active, stats["streams"]["active"])
        await asyncio.sleep(STATS_POLL_S)
    return [task.result() for task in tasks], peak_active


def test_32_realtime_clients_every_transcript_right(server: Any, clips: list[Clip],
                                                    references: list[list[str]]) -> None:
    before = server.stats()["finish_reasons"]
    formats = ["f32le" if i % 4 == 3 else "s16le" for i in range(NUM_CLIENTS)]
    clients = [stream_clip(server.ws_url, clip.pcm(fmt), fmt)
               for clip, fmt in zip(clips, formats, strict=True)]
    results, peak_active = asyncio.run(run_with_stats(server, clients))

    for index, result in enumerate(results):
        assert_clean_finish(result, references[index], f"client {index} ({formats[index]})")
    assert peak_active >= NUM_CLIENTS // 2, f"only {peak_active} streams ever ran at once"
    after = server.wait_until_idle()["finish_reasons"]
    assert after["stop"] - before["stop"] == NUM_CLIENTS
    others = {k: after[k] - before[k] for k in after if k != "stop"}
    assert {"length", "timeout", "abort", "error"} <= others.keys() and not any(
        others.values()), others  # every stream ended "stop", none any other way


def test_disconnect_storm_leaves_other_streams_and_the_pool_intact(
        server: Any, clips: list[Clip], references: list[list[str]]) -> None:
    rng = random.Random(20261130)
    before = server.stats()["finish_reasons"]
    steady = list(range(0, 24, 2))
    vanishing = list(range(1, 24, 2))
    clients = []
    for index in range(24):
        if index in steady:
            clients.append(stream_clip(server.ws_url, clips[index].pcm()))
        else:
            seconds = len(clips[index].samples) / 16000
            clients.append(stream_clip(
                server.ws_url, clips[index].pcm(), vanish_after_s=rng.uniform(0.0, 0.9 * seconds),
                vanish_by_reset=rng.random() < 0.5))
    results, _ = asyncio.run(run_with_stats(server, clients))

    for index in steady:
        assert_clean_finish(results[index], references[index], f"steady client {index}")
    assert all(results[i].vanished for i in vanishing)
    after = server.wait_until_idle()["finish_reasons"]
    assert after["stop"] - before["stop"] == len(steady)
    assert 1 <= after["abort"] - before["abort"] <= len(vanishing)
    assert after["error"] == before["error"] and after["timeout"] == before["timeout"]
    # The server keeps serving: one more stream after the storm is still exact.
    (again,), _ = asyncio.run(run_with_stats(server, [stream_clip(server.ws_url, clips[1].pcm(),
                                                                  realtime=False)]))
    assert_clean_finish(again, references[1], "client after the storm")
