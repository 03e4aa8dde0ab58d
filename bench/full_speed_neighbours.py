"""A live speaker beside clients sending at full speed: does the speaker keep their words?

One ``oasr-server`` (second pass on) serves one client streaming the devset's read passage at
real-time pace in 100 ms frames (`bench/live_text.py`'s client), alone and then beside N
clients that stream a long recording in 1 s frames as fast as the server reads them (their
websocket pings off, as a batch uploader's may be). The script reports the live client's
finals WER and sources in both runs, the full-speed clients' ends (``done`` or how they were
cut) and the second pass's counters (finals kept as CTC for a full backlog, given way to a
live stream, expired while held).

    python bench/full_speed_neighbours.py --clients 16
    python bench/full_speed_neighbours.py --clients 16 --server-tree /path/to/other/checkout

``--server-tree`` runs the server from another checkout (its ``oasr`` and ``backend``), so two
revisions are measured by the same clients in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_text import SR, ClientLog, Passage, passages, run_client  # noqa: E402

from oasr.benchmarks.server_load import server_process  # noqa: E402
from oasr.benchmarks.workload import DEVSET_DIR  # noqa: E402
from oasr.text.wer import ErrorCounts  # noqa: E402

FRAME_S = 1.0  # the full-speed clients' frames


async def full_speed_client(url: str, pcm: bytes, frame_bytes: int) -> dict[str, Any]:
    """Stream ``pcm`` as fast as the server takes it, then end; how it ended."""
    started = time.monotonic()
    try:
        async with websockets.connect(url, max_size=2**22, ping_interval=None) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": SR, "format": "s16le"}))
            for i in range(0, len(pcm), frame_bytes):
                await ws.send(pcm[i:i + frame_bytes])
            await ws.send(json.dumps({"type": "end"}))
            finals = 0
            async for raw in ws:
                message = json.loads(raw)
                finals += message.get("type") == "final"
                if message.get("type") in ("done", "error") and message.get("code") != "bad_request":
                    return {"end": message.get("finish_reason") or message.get("code"),
                            "finals": finals, "seconds": round(time.monotonic() - started, 1)}
            return {"end": "closed", "finals": finals}
    except Exception as exc:  # a cut client is the measurement, not a failure of the run
        return {"end": f"{type(exc).__name__}: {exc}"[:80],
                "seconds": round(time.monotonic() - started, 1)}


def finals_of(log: ClientLog) -> list[dict[str, Any]]:
    return [m for _, m in log.messages if m.get("type") == "final" and m.get("text")]


async def run(address: str, live: Passage, long_pcm: bytes, clients: int) -> dict[str, Any]:
    url = f"ws://{address}/ws/asr"
    live_task = asyncio.create_task(run_client(url, live, 0.0))
    await asyncio.sleep(1.0)  # the live speaker is admitted first
    frame_bytes = int(FRAME_S * SR) * 2
    neighbours = [asyncio.create_task(full_speed_client(url, long_pcm, frame_bytes))
                  for _ in range(clients)]
    log = await live_task
    ends = await asyncio.gather(*neighbours)
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"http://{address}/api/stats")).json()
    finals = finals_of(log)
    live_ends = [m for _, m in log.messages if m.get("type") in ("done", "error")]
    counts = ErrorCounts()
    counts.add(live.reference, " ".join(f["text"] for f in finals))
    second = stats["second_pass"]
    return {
        "clients": clients, "live_error": log.error,
        "live_end": [{k: m.get(k) for k in ("type", "finish_reason", "code", "message")
                      if m.get(k)} for m in live_ends],
        "live_final_wer": round(counts.wer, 1), "live_word_errors": counts.word_errors,
        "live_words": counts.words,
        "live_sources": {s: sum(f.get("source") == s for f in finals)
                         for s in ("whisper", "combined", "ctc")},
        "neighbour_ends": {end: sum(e["end"] == end for e in ends)
                           for end in sorted({e["end"] for e in ends})},
        "backlog_full": second.get("num_backlog_full"), "evicted": second.get("num_evicted"),
        "expired": second.get("num_expired"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16, help="full-speed neighbours")
    parser.add_argument("--long-s", type=float, default=240.0,
                        help="seconds of audio each neighbour sends")
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--server-tree", type=Path, default=None,
                        help="run the server from this checkout instead")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("server_flags", nargs="*", help="more oasr-server flags, after --")
    args = parser.parse_args(argv)
    material = passages(args.devset)
    live = next(p for p in material if p.name == "devset_read")
    joined = np.concatenate([p.audio for p in material])
    long_audio = np.resize(joined, int(args.long_s * SR))
    long_pcm = (np.clip(long_audio, -1, 1) * 32767).astype("<i2").tobytes()
    env = dict(os.environ)
    if args.server_tree is not None:  # its code first: on the path, and the server's cwd
        env["PYTHONPATH"] = str(args.server_tree)
        os.chdir(args.server_tree)
    flags = ["--second-pass", "whisper", "--max-connections", str(args.clients + 8),
             *args.server_flags]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for clients in (0, args.clients):
            log_path = Path(tmp) / f"server_{clients}.log"
            with server_process(flags, log_path, env=env) as address:
                rows.append(asyncio.run(run(address, live, long_pcm, clients)))
            print(json.dumps(rows[-1]), flush=True)
    keys = ["clients", "live_end", "live_final_wer", "live_word_errors", "live_words", "live_sources",
            "neighbour_ends", "backlog_full", "evicted", "expired"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if args.out:
        args.out.write_text(json.dumps({"date_utc": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime()),
                                        "server_tree": str(args.server_tree or ""),
                                        "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
