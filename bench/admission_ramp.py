"""Admission by latency under a ramp (issue #50, item 4): does the server refuse new streams
before the admitted ones fall behind, and are their finals as accurate as at low load?

Starts ``oasr-server`` on 127.0.0.1 (the bundled model, the server's defaults: Whisper second
pass, refined partials, ``--admission-budget 0.8``) with ``--max-batch-size 256``, so that slots
never bound admission; this process is the load generator (its own process, loopback only).

1. Low load: ``LOW_CLIENTS`` clients at once, each streaming ~``CLIENT_AUDIO_S`` of the dev set's
   real recordings (tests/data/audio/devset real_*, back to back with 1.5 s pauses) at real-time
   pace in 100 ms frames.
2. Ramp: a new client every second for ``--ramp`` seconds, the same kind of audio (each client
   its own rotation of the recordings). A client that is refused (``busy``, after ``--max-wait``)
   is counted and gives up.

Per admitted client: each partial's delay (its arrival minus when the audio it covers, its
``end``, had been sent) and its ``lag_ms`` (the server's own: audio received, not decoded), the
finals' text against the recordings' references (WER, normalised). Bounded: every client
sends a fixed amount of audio and the whole run is cut at a deadline. Only point it at the
server it starts itself.

Usage: python bench/admission_ramp.py [--ramp 60] [--out bench/results_admission_ramp.json]
(figures: docs/benchmarks.md, "Admission by latency under a ramp").
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from oasr.audio import read_audio
from oasr.benchmarks.server_load import percentile, server_process
from oasr.text.wer import edit_distance, normalize_transcript

REPO = Path(__file__).resolve().parents[1]
DEVSET = REPO / "tests" / "data" / "audio" / "devset"
RATE = 16000
FRAME_S = 0.1
PAUSE_S = 1.5  # silence between two recordings of a client: each its own segment
CLIENT_AUDIO_S = 90.0  # longer than the ramp takes to pass the server's capacity
LOW_CLIENTS = 3
SERVER_FLAGS = ("--max-batch-size", "256", "--max-connections", "400")


@dataclass
class Client:
    index: int
    started_at: float = 0.0  # seconds since the ramp began
    admitted: bool = False
    refused: str = ""  # the refusal's code and message
    retry_after_s: float | None = None
    wait_s: float = 0.0  # start sent -> ready or refusal
    partial_delays: list[float] = field(default_factory=list)
    partial_lags: list[float] = field(default_factory=list)
    text: str = ""
    sources: dict[str, int] = field(default_factory=dict)  # finals by the pass of their text
    reference: str = ""
    finish: str = ""
    errors: list[str] = field(default_factory=list)


def recordings() -> list[tuple[np.ndarray, str]]:
    manifest = dict(line.split("\t", 1) for line in
                    (DEVSET / "manifest.tsv").read_text().splitlines() if "\t" in line)
    names = sorted(n for n in manifest if n.startswith("real_"))
    return [(read_audio(DEVSET / name), manifest[name].strip()) for name in names]


def client_audio(index: int, pool: list[tuple[np.ndarray, str]]) -> tuple[bytes, str]:
    """Recordings from rotation ``index`` on, back to back, until ``CLIENT_AUDIO_S``."""
    pieces, words, total = [], [], 0.0
    pause = np.zeros(int(PAUSE_S * RATE), dtype=np.float32)
    k = index * 5
    while total < CLIENT_AUDIO_S:
        audio, text = pool[k % len(pool)]
        pieces += [audio, pause]
        words.append(text)
        total += (audio.size + pause.size) / RATE
        k += 1
    pcm = (np.clip(np.concatenate(pieces), -1, 1) * 32767).astype("<i2").tobytes()
    return pcm, " ".join(words)


async def run_client(url: str, client: Client, pcm: bytes, deadline: float) -> None:
    from websockets.asyncio.client import connect

    frame = int(RATE * FRAME_S) * 2
    sent: list[tuple[int, float]] = []  # (samples sent, when)
    finals: dict[int, str] = {}
    try:
        async with connect(url, max_size=2**22, open_timeout=30) as ws:
            began = time.monotonic()
            await ws.send(json.dumps({"type": "start", "sample_rate": RATE}))
            first = json.loads(await asyncio.wait_for(ws.recv(), 30))
            client.wait_s = time.monotonic() - began
            if first.get("type") != "ready":
                client.refused = f"{first.get('code')}: {first.get('message')}"
                client.retry_after_s = first.get("retry_after_s")
                return
            client.admitted = True

            async def receive() -> None:
                async for raw in ws:
                    now = time.monotonic()
                    message = json.loads(raw)
                    kind = message.get("type")
                    if kind == "partial":
                        client.partial_lags.append(message.get("lag_ms", 0) / 1000)
                        needed = round(message["end"] * RATE)
                        at = bisect.bisect_left([n for n, _ in sent], needed)
                        if at < len(sent):
                            client.partial_delays.append(now - sent[at][1])
                    elif kind == "final":
                        finals[message["segment"]] = message["text"]
                        source = message.get("source", "ctc")
                        client.sources[source] = client.sources.get(source, 0) + 1
                    elif kind == "error":
                        client.errors.append(f"{message.get('code')}: {message.get('message')}")
                    elif kind == "done":
                        client.finish = message.get("finish_reason", "")

            receiver = asyncio.create_task(receive())
            start = time.monotonic()
            for k, i in enumerate(range(0, len(pcm), frame)):
                await asyncio.sleep(max(0.0, start + k * FRAME_S - time.monotonic()))
                await ws.send(pcm[i:i + frame])
                sent.append(((i + len(pcm[i:i + frame])) // 2, time.monotonic()))
            await ws.send(json.dumps({"type": "end"}))
            await asyncio.wait_for(receiver, max(1.0, deadline - time.monotonic()))
    except Exception as exc:  # every failure is a measured error, not a crash of the run
        client.errors.append(f"{type(exc).__name__}: {exc}")
    client.text = " ".join(finals[s] for s in sorted(finals))


async def sample_stats(address: str, into: list[dict[str, object]], stop: asyncio.Event,
                       t0: float) -> None:
    async with httpx.AsyncClient() as http:
        while not stop.is_set():
            try:
                streams = (await http.get(f"http://{address}/api/stats", timeout=5)).json()
                s, step = streams["streams"], streams["step"]
                second = streams["second_pass"]
                into.append({"t": round(time.monotonic() - t0, 1), "active": s["active"],
                             "waiting": s["waiting"], "admissible": s["admissible"],
                             "cost_per_audio_s": s["cost_per_audio_s"], "rtf": streams["rtf"],
                             "step_ms": step["last_ms"], "sp_backlog": second["backlog"],
                             "sp_expired": second["num_expired"],
                             "sp_backlog_full": second["num_backlog_full"],
                             "sp_evicted": second["num_evicted"],
                             "sp_holds": second["num_holds"],
                             "sp_busy_s": second.get("busy_s")})
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1.0)


async def phase(address: str, num_clients: int, every_s: float, pool: list[tuple[np.ndarray,
                str]], first_index: int, timeline: list[dict[str, object]]) -> list[Client]:
    url = f"ws://{address}/ws/asr"
    t0 = time.monotonic()
    deadline = t0 + num_clients * every_s + CLIENT_AUDIO_S + 60
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_stats(address, timeline, stop, t0))
    clients, tasks = [], []
    for n in range(num_clients):
        await asyncio.sleep(max(0.0, t0 + n * every_s - time.monotonic()))
        client = Client(first_index + n, started_at=round(time.monotonic() - t0, 2))
        pcm, client.reference = client_audio(client.index, pool)
        clients.append(client)
        tasks.append(asyncio.create_task(run_client(url, client, pcm, deadline)))
    await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()))
    stop.set()
    await sampler
    return clients


def wer(clients: list[Client]) -> float:
    edits = words = 0
    for c in clients:
        reference = normalize_transcript(c.reference).split()
        edits += edit_distance(reference, normalize_transcript(c.text).split())
        words += len(reference)
    return edits / words if words else math.nan


def ms(seconds: float) -> int | None:
    """Whole milliseconds (None for no value)."""
    return None if math.isnan(seconds) else round(1000 * seconds)


def summary(clients: list[Client]) -> dict[str, object]:
    admitted = [c for c in clients if c.admitted]
    refused = [c for c in clients if not c.admitted]
    first_refusal = min((c.index for c in refused), default=None)
    before = [c for c in admitted if first_refusal is None or c.index < first_refusal]
    delays = [d for c in admitted for d in c.partial_delays]
    lags = [x for c in admitted for x in c.partial_lags]
    return {
        "clients": len(clients), "admitted": len(admitted), "refused": len(refused),
        "admitted_before_first_refusal": len(before),
        "first_refusal_at_s": next((c.started_at for c in clients if not c.admitted), None),
        "refusal_sample": next((c.refused for c in refused), ""),
        "retry_after_s": sorted({c.retry_after_s for c in refused if c.retry_after_s}),
        "partials": len(delays),
        "partial_delay_p50_ms": ms(percentile(delays, 0.5)),
        "partial_delay_p95_ms": ms(percentile(delays, 0.95)),
        "partial_delay_max_ms": ms(max(delays, default=math.nan)),
        "partial_lag_p95_ms": ms(percentile(lags, 0.95)),
        "finals_wer": round(wer(admitted), 4),
        "finals_by_source": {k: sum(c.sources.get(k, 0) for c in admitted)
                             for k in sorted({k for c in admitted for k in c.sources})},
        "not_stop": [(c.index, c.finish, c.errors[:2]) for c in admitted
                     if c.finish != "stop" or c.errors],
    }


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    pool = recordings()
    with tempfile.TemporaryDirectory(prefix="oasr-ramp-") as tmp, \
            server_process([*SERVER_FLAGS, *args.server_flag], Path(tmp) / "server.log") as address:
        calibrated = httpx.get(f"http://{address}/api/stats", timeout=10).json()["streams"]
        low_timeline: list[dict[str, object]] = []
        low = await phase(address, LOW_CLIENTS, 0.0, pool, 0, low_timeline)
        await asyncio.sleep(3)
        ramp_timeline: list[dict[str, object]] = []
        load_before = os.getloadavg()[0]
        ramp = await phase(address, args.ramp, 1.0, pool, 0, ramp_timeline)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "cpus": os.cpu_count(),
            "load_average_before_ramp": round(load_before, 2),
            "server_flags": [*SERVER_FLAGS, *args.server_flag],
            "cost_per_audio_s_at_start": calibrated["cost_per_audio_s"],
            "admissible_at_start": calibrated["admissible"],
            "low": summary(low), "ramp": summary(ramp),
            "ramp_clients": [{k: v for k, v in asdict(c).items()
                              if k not in ("partial_delays", "partial_lags", "reference")}
                             | {"partial_delay_p95_ms": ms(percentile(c.partial_delays, 0.95))}
                             for c in ramp],
            "ramp_timeline": ramp_timeline}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ramp", type=int, default=60, help="clients added, one a second")
    parser.add_argument("--server-flag", action="append", default=[],
                        help="another oasr-server flag (repeatable; value as its own flag)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results_admission_ramp.json")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("cost_per_audio_s_at_start", "low", "ramp")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
