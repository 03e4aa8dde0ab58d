"""Websocket load generator: N clients streaming real speech at real-time pace to /ws/asr.

Runs as its own process (``python -m oasr.benchmarks.loadgen SPEC OUT``) so its CPU use and
event loop are separate from the server's. Bounded: every client sends a fixed amount of
audio, and the whole run is cut at ``deadline_s``.

Partial latency: the engine is deterministic per stream, so the expected sequence of partial
texts of each stream, with the audio samples each one needed, is computed beforehand (see
``server_load.expected_partials``). A partial that arrives is matched, in order, to the first
expected partial with the same text; its latency is arrival time minus the time the last
sample it needed was sent. Partials that match nothing are counted, not timed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oasr.benchmarks.workload import load_speech


@dataclass(frozen=True)
class LoadSpec:
    """What the load generator does.

    Attributes:
        url: the websocket endpoint (ws://127.0.0.1:PORT/ws/asr).
        num_clients: concurrent clients.
        audio_dir: dev-set directory; client i streams ``load_speech(...)[i]``.
        seconds: audio each client sends.
        frame_ms: audio per binary frame, sent every ``frame_ms`` of wall time.
        start_spread_s: client start times are spread evenly over this window.
        deadline_s: the whole run stops after this many seconds.
        expected: per client, [text, samples needed] of every partial, in order.
    """

    url: str
    num_clients: int
    audio_dir: str
    seconds: float
    frame_ms: int = 100
    start_spread_s: float = 0.64
    deadline_s: float = 60.0
    expected: list[list[tuple[str, int]]] = field(default_factory=list)


@dataclass
class ClientResult:
    """One client's measurements (seconds)."""

    partial_latencies: list[float] = field(default_factory=list)
    num_partials: int = 0
    num_unmatched: int = 0
    final_latency: float | None = None  # "end" sent -> "done" received
    errors: list[str] = field(default_factory=list)


class _Timeline:
    """When each prefix of the audio had been sent."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float]] = []  # (samples sent so far, time)

    def sent_at(self, samples: int) -> float | None:
        for count, at in self.marks:
            if count >= samples:
                return at
        return None


def _match(result: ClientResult, expected: list[tuple[str, int]], cursor: int, text: str,
           now: float, timeline: _Timeline, total: int) -> int:
    """Time one partial against the expected sequence; returns the new cursor."""
    result.num_partials += 1
    for j in range(cursor, len(expected)):
        if expected[j][0] == text:
            sent = timeline.sent_at(min(expected[j][1], total))
            if sent is None:
                break
            result.partial_latencies.append(now - sent)
            return j + 1
    result.num_unmatched += 1
    return cursor


async def run_client(spec: LoadSpec, index: int, pcm: np.ndarray) -> ClientResult:
    """Stream ``pcm`` (int16) in real time, then end; collect latencies and errors."""
    from websockets.asyncio.client import connect

    result = ClientResult()
    expected = [tuple(e) for e in spec.expected[index]] if spec.expected else []
    await asyncio.sleep(spec.start_spread_s * index / max(1, spec.num_clients))
    frame = int(16000 * spec.frame_ms / 1000)
    timeline = _Timeline()
    try:
        async with connect(spec.url, max_size=2**20, open_timeout=30) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "format": "s16le"}))
            ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if ready.get("type") != "ready":
                result.errors.append(f"no ready: {ready}")
                return result
            ended_at: list[float] = []

            async def receive() -> None:
                cursor = 0
                async for raw in ws:
                    now = time.monotonic()
                    message = json.loads(raw)
                    kind = message.get("type")
                    if kind == "partial":
                        cursor = _match(result, expected, cursor, message["text"], now,  # type: ignore[arg-type]
                                        timeline, len(pcm))
                    elif kind == "error":
                        result.errors.append(f"{message.get('code')}: {message.get('message')}")
                    elif kind == "done":
                        if ended_at:
                            result.final_latency = now - ended_at[0]
                        if message.get("finish_reason") != "stop":
                            result.errors.append(f"finish_reason {message.get('finish_reason')}")

            receiver = asyncio.create_task(receive())
            began = time.monotonic()
            for k, start in enumerate(range(0, len(pcm), frame)):
                await asyncio.sleep(max(0.0, began + k * spec.frame_ms / 1000 - time.monotonic()))
                chunk = pcm[start : start + frame]
                await ws.send(chunk.tobytes())
                timeline.marks.append((start + len(chunk), time.monotonic()))
            await ws.send(json.dumps({"type": "end"}))
            ended_at.append(time.monotonic())
            await asyncio.wait_for(receiver, 30)
            if result.final_latency is None:
                result.errors.append("no done message")
    except Exception as exc:  # every failure is a measured error, not a crash of the run
        result.errors.append(f"{type(exc).__name__}: {exc}")
    return result


async def run_load(spec: LoadSpec) -> list[ClientResult]:
    """All clients at once, cut at ``deadline_s``."""
    speech = load_speech(Path(spec.audio_dir), spec.num_clients, spec.seconds)
    pcm = [np.clip(s * 32768.0, -32768, 32767).astype("<i2") for s in speech]
    tasks = [asyncio.create_task(run_client(spec, i, p)) for i, p in enumerate(pcm)]
    done, pending = await asyncio.wait(tasks, timeout=spec.deadline_s)
    for task in pending:
        task.cancel()
    results = []
    for task in tasks:
        if task in done:
            results.append(task.result())
        else:
            results.append(ClientResult(errors=[f"still running at the {spec.deadline_s} s deadline"]))
    return results


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m oasr.benchmarks.loadgen SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = LoadSpec(**json.loads(Path(args[0]).read_text()))
    results = asyncio.run(run_load(spec))
    payload: dict[str, Any] = {"clients": [asdict(r) for r in results]}
    Path(args[1]).write_text(json.dumps(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
