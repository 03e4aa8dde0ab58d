"""Replicas behind a real HAProxy running the project's config (#18): sessions spread by least
connections, a full replica stops getting sessions, a SIGTERM drains one replica with zero
errors, and a ``kill -9`` costs only that replica's own clients."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from haproxy_helpers import HAPROXY, HaproxyProcess, start_haproxy
from support.servers import ServerProcess, launch_server
from ws_clients import ClientResult, Clip, assert_clean_finish, server_flags, stream_clip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed "
                                 "(Debian package haproxy; .ci/run installs it)")]

REPLICAS = ("r0", "r1", "r2")
SLOTS = 2


@pytest.fixture
def cluster(random_model_dir: Path, tmp_path: Path) -> Iterator[
        tuple[HaproxyProcess, dict[str, ServerProcess]]]:
    servers = {}
    try:
        for name in REPLICAS:
            servers[name] = launch_server(
                random_model_dir, (*server_flags(SLOTS, max_wait_s=0.0), "--replica", name),
                tmp_path / f"{name}.log")
        haproxy = start_haproxy({n: s.address for n, s in servers.items()}, tmp_path)
        try:
            haproxy.wait_for_states({name: "UP" for name in REPLICAS})
            yield haproxy, servers
        finally:
            haproxy.stop()
    finally:
        for server in servers.values():
            if server.is_running():
                server.process.kill()
                server.process.wait(30)


def replica_of(result: ClientResult) -> str:
    return next(m["replica"] for m in result.messages if m["type"] == "ready")


async def wait_for(predicate: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not seen within {timeout_s} s"
        await asyncio.sleep(0.02)


async def open_one_by_one(url: str, clips: list[Clip], realtime: bool = True) -> tuple[
        list[ClientResult], list[asyncio.Task[ClientResult]]]:
    """Start a session per clip, each once the one before is live, so that least connections
    sees every earlier session: HAProxy's threads may pick one server for two connections that
    arrive in the same instant, before either is counted (seen on a 2-core box: two sessions
    on one replica, and during a drain a third on a replica of two slots, refused ``busy``)."""
    live = [ClientResult() for _ in clips]
    tasks = []
    for i, (clip, result) in enumerate(zip(clips, live, strict=True)):
        tasks.append(asyncio.create_task(stream_clip(url, clip.pcm(), realtime=realtime,
                                                     result=result)))
        await wait_for(lambda result=result: result.got_ready, f"session {i} live")
    return live, tasks


def test_replicas_behind_haproxy(cluster: tuple[HaproxyProcess, dict[str, ServerProcess]],
                                 clips: list[Clip], references: list[list[str]]) -> None:
    haproxy, servers = cluster
    url = haproxy.ws_url

    async def spread() -> None:
        # three concurrent sessions land on three replicas (least connections)
        _, tasks = await open_one_by_one(url, [clips[i] for i in range(3)])
        results = await asyncio.gather(*tasks)
        for i, result in enumerate(results):
            assert_clean_finish(result, references[i], f"spread session {i}")
        assert sorted(replica_of(r) for r in results) == list(REPLICAS)

    async def full_replica() -> None:
        # fill r0's slots directly; HAProxy sees /readyz 503 and sends new sessions elsewhere
        holders = [ClientResult() for _ in range(SLOTS)]
        tasks = [asyncio.create_task(stream_clip(servers["r0"].ws_url, clips[3 + i].pcm(),
                                                 result=holders[i])) for i in range(SLOTS)]
        await wait_for(lambda: all(h.got_ready for h in holders), "r0 full")
        await asyncio.to_thread(haproxy.wait_for_states, {"r0": "DOWN", "r1": "UP", "r2": "UP"})
        results = await asyncio.gather(*(stream_clip(url, clips[5 + i].pcm(), realtime=False)
                                         for i in range(4)))
        for i, result in enumerate(results):
            assert_clean_finish(result, references[5 + i], f"session {i} while r0 is full")
            assert replica_of(result) in ("r1", "r2")
        for i, result in enumerate(await asyncio.gather(*tasks)):
            assert_clean_finish(result, references[3 + i], f"r0 holder {i}")
        await asyncio.to_thread(haproxy.wait_for_states, {"r0": "UP"})

    async def drain_one() -> str:
        # SIGTERM to a replica mid-stream: its sessions finish, new ones land elsewhere
        live, tasks = await open_one_by_one(url, [clips[10 + i] for i in range(3)])
        victim = replica_of(live[0])
        servers[victim].process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(haproxy.wait_for_states, {victim: "DOWN"})
        _, late_tasks = await open_one_by_one(url, [clips[13 + i] for i in range(2)],
                                              realtime=False)
        late = await asyncio.gather(*late_tasks)
        for i, result in enumerate(late):
            assert_clean_finish(result, references[13 + i], f"session {i} during the drain")
            assert replica_of(result) != victim
        for i, result in enumerate(await asyncio.gather(*tasks)):
            assert_clean_finish(result, references[10 + i], f"session {i} live at SIGTERM")
        assert await asyncio.to_thread(servers[victim].process.wait, 30) == 0
        return victim

    async def kill_one(survivors: list[str]) -> None:
        # kill -9: only that replica's own clients see a closed connection
        live, tasks = await open_one_by_one(url, [clips[16 + i] for i in range(2)])
        assert {replica_of(r) for r in live} == set(survivors)
        victim = replica_of(live[0])
        servers[victim].process.kill()
        results = await asyncio.gather(*tasks)
        assert results[0].finish_reason is None and results[0].close_code != 1000
        assert_clean_finish(results[1], references[17], "the other replica's session")
        await asyncio.to_thread(haproxy.wait_for_states, {victim: "DOWN"})
        after = await stream_clip(url, clips[18].pcm(), realtime=False)
        assert_clean_finish(after, references[18], "a session after the kill")

    asyncio.run(spread())
    asyncio.run(full_replica())
    drained = asyncio.run(drain_one())
    asyncio.run(kill_one([r for r in REPLICAS if r != drained]))
    for name, server in servers.items():
        assert "Traceback" not in server.log_path.read_text(), name
