"""200 sessions in sequence: the server process's memory stays flat.

Each session opens a websocket, sends one second of real speech as fast as it can, ends and
waits for the close. After a warm-up (allocator pools, lazy imports, the first batch shapes),
the resident set of the ``oasr-server`` process may not grow by more than a small bound while
200 more sessions come and go; every session's transcript is still exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ws_clients import (
    Clip,
    assert_clean_finish,
    assert_server_clean,
    make_clips,
    reference_finals,
    server_flags,
    stream_clip,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NUM_WARMUP = 30
NUM_SESSIONS = 200
MAX_GROWTH_BYTES = 8 * 2**20  # 40 KiB a session; measured: about 1 MiB in all (bounded stats)
NUM_CLIPS = 8


@pytest.fixture(scope="module")
def short_clips(devset_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Clip]:
    return make_clips(devset_dir, NUM_CLIPS, 1.0, tmp_path_factory.mktemp("short_clips"))


def test_200_sequential_sessions_do_not_grow_memory(
        start_server: Callable[..., Any], random_model_dir: Path,
        short_clips: list[Clip]) -> None:
    references = reference_finals(random_model_dir, short_clips, 16)
    server = start_server(random_model_dir, *server_flags(4))

    async def sessions(first: int, count: int) -> None:
        for index in range(first, first + count):
            clip = index % NUM_CLIPS
            result = await stream_clip(server.ws_url, short_clips[clip].pcm(), realtime=False)
            assert_clean_finish(result, references[clip], f"session {index}")

    asyncio.run(sessions(0, NUM_WARMUP))
    server.wait_until_idle()
    rss = [server.rss_bytes()]
    for block in range(4):
        asyncio.run(sessions(NUM_WARMUP + block * NUM_SESSIONS // 4, NUM_SESSIONS // 4))
        rss.append(server.rss_bytes())
    stats = server.wait_until_idle()
    mib = [round(r / 2**20, 1) for r in rss]
    assert rss[-1] - rss[0] <= MAX_GROWTH_BYTES, f"RSS grew {mib} MiB over {NUM_SESSIONS} sessions"
    assert stats["finish_reasons"]["stop"] == NUM_WARMUP + NUM_SESSIONS
    assert_server_clean(server)
