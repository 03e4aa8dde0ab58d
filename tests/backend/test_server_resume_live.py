"""Resume over a real socket: uvicorn on 127.0.0.1, a held-out recording streamed at real-time
pace by a websockets client whose TCP connection is cut (no close frame) half way through."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from server_helpers import (
    DEFAULT_MODEL_DIR,
    frames,
    get_stats,
    live_server,
    pool_is_full,
    wait_until,
)
from support.paths import DEVSET_DIR
from test_server_live import _wav_s16le, final_text
from websockets.asyncio.client import ClientConnection, connect

from backend.config import ServerConfig
from oasr.engine import EngineConfig
from oasr.text.wer import normalize_transcript

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FRAME_S = 0.1
RECORDING = "real_jfk.wav"  # 11 s, one sentence: the cut falls mid-speech
AWAY_S = 2.0  # the client is away this long (the target: back within 5 s)


async def send_paced(ws: ClientConnection, pieces: list[bytes]) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    for index, frame in enumerate(pieces):
        await asyncio.sleep(max(0.0, began + index * FRAME_S - loop.time()))
        await ws.send(frame)


async def receive_all(ws: ClientConnection, into: list[dict[str, Any]]) -> None:
    async for message in ws:
        into.append(json.loads(message))


async def uninterrupted(address: str, pcm: bytes) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    async with connect(f"ws://{address}/ws/asr", max_size=2**20) as ws:
        receiver = asyncio.create_task(receive_all(ws, messages))
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
        await send_paced(ws, frames(pcm))
        await ws.send(json.dumps({"type": "end"}))
        await asyncio.wait_for(receiver, 60)
    return messages


async def cut_and_resumed(address: str, pcm: bytes) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]], int]:
    """The first half, a TCP cut, ``AWAY_S`` away, a resume, the rest from where the server
    says its audio stopped. Returns (messages before the cut, after it, suspended count seen
    while away)."""
    half = len(frames(pcm)) // 2
    before: list[dict[str, Any]] = []
    ws = await connect(f"ws://{address}/ws/asr", max_size=2**20)
    receiver = asyncio.create_task(receive_all(ws, before))
    await ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
    await send_paced(ws, frames(pcm)[:half])
    await asyncio.sleep(0.3)  # the last frames reach the server before the cut
    ws.transport.abort()  # no close frame: the connection is simply lost
    receiver.cancel()
    await asyncio.sleep(AWAY_S)
    suspended = (await asyncio.to_thread(get_stats, address))["streams"]["suspended"]
    ready = before[0]
    finals = [m["segment"] for m in before if m["type"] == "final"]
    after: list[dict[str, Any]] = []
    async with connect(f"ws://{address}/ws/asr", max_size=2**20) as ws:
        await ws.send(json.dumps({"type": "start", "resume": ready["resume_token"],
                                  "last_final": finals[-1] if finals else -1}))
        resumed = json.loads(await ws.recv())
        after.append(resumed)
        receiver = asyncio.create_task(receive_all(ws, after))
        offset = 2 * resumed["received_samples"]  # s16le: 2 bytes a sample
        await send_paced(ws, frames(pcm[offset:]))
        await ws.send(json.dumps({"type": "end"}))
        await asyncio.wait_for(receiver, 60)
    return before, after, suspended


@pytest.mark.skipif(not DEFAULT_MODEL_DIR.is_dir(),
                    reason="the bundled default model (oasr/assets/default_model) is missing")
def test_a_recording_cut_half_way_and_resumed_gives_the_uninterrupted_transcript() -> None:
    pytest.importorskip("tokenizers")
    from oasr.decoding import GpuDecoderConfig
    from oasr.engine.options import default_beam_size

    # the product's path as test_server_live runs it: CTC beam + LMs, Whisper finals, no
    # refined partials (their forced prefixes make a final depend on timing)
    engine = EngineConfig(device="cpu", max_batch_size=4, max_num_blocks=4 * 64,
                          second_pass="whisper", refine=None,
                          decoder=GpuDecoderConfig(beam_size=default_beam_size(None, "auto")))
    pcm = _wav_s16le(DEVSET_DIR / RECORDING)
    with live_server(ServerConfig(port=0, engine=engine)) as address:
        whole = asyncio.run(uninterrupted(address, pcm))
        before, after, suspended = asyncio.run(cut_and_resumed(address, pcm))
        assert suspended == 1  # kept, suspended, while its client was away
        assert after[0]["resumed"] is True and after[0]["stream_id"] == before[0]["stream_id"]
        assert 0 < after[0]["received_samples"] <= len(pcm) // 2
        assert after[-1]["type"] == "done" and after[-1]["finish_reason"] == "stop"
        segments = [m["segment"] for m in before + after if m["type"] == "final"]
        assert len(segments) == len(set(segments))  # no final arrived twice
        # the same words (a sentence's full stop may come or not from one run to the next)
        assert normalize_transcript(final_text(before + after)) == \
            normalize_transcript(final_text(whole)), (final_text(before + after), final_text(whole))
        wait_until(lambda: pool_is_full(get_stats(address)), what="pool free")
        stats = get_stats(address)
        assert stats["streams"]["suspended"] == 0
        assert stats["finish_reasons"].get("abort", 0) == 0
