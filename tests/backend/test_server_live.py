"""A real uvicorn on 127.0.0.1 with websockets clients streaming at real-time pace."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from server_helpers import (
    DEFAULT_MODEL_DIR,
    frames,
    get_stats,
    live_server,
    synthetic_pcm,
    wait_until,
)
from support.paths import DEVSET_DIR
from websockets.asyncio.client import connect

from backend.config import ServerConfig
from backend.server import DrainingServer, _serve, build_uvicorn_config
from oasr.audio import read_audio
from oasr.engine import EngineConfig, EngineThread, transcribe_files
from oasr.text.wer import word_error_rate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FRAME_S = 0.1


async def stream_realtime(address: str, pcm: bytes, start: dict[str, Any]) -> tuple[
        list[dict[str, Any]], int | None]:
    """Send ``pcm`` in 100 ms frames at real-time pace, then end; collect every message."""
    messages: list[dict[str, Any]] = []
    async with connect(f"ws://{address}/ws/asr", max_size=2**20) as ws:
        async def receive() -> None:
            async for message in ws:
                messages.append(json.loads(message))

        receiver = asyncio.create_task(receive())
        await ws.send(json.dumps(start))
        loop = asyncio.get_running_loop()
        began = loop.time()
        frame_bytes = int(start.get("sample_rate", 16000) * FRAME_S) * 2
        for index, frame in enumerate(frames(pcm, frame_bytes)):
            await asyncio.sleep(max(0.0, began + index * FRAME_S - loop.time()))
            await ws.send(frame)
        await ws.send(json.dumps({"type": "end"}))
        await asyncio.wait_for(receiver, 60)
    return messages, ws.close_code


def final_text(messages: list[dict[str, Any]]) -> str:
    return " ".join(m["text"] for m in messages if m["type"] == "final" and m["text"])


def test_sixteen_simultaneous_clients_then_pool_back_to_full(
        make_config: Callable[..., ServerConfig]) -> None:
    config = make_config(engine={"max_batch_size": 16, "max_num_blocks": 16 * 8}, port=0,
                         stats_interval_s=0.1)
    with live_server(config) as address:
        peak_active = 0

        async def run_all() -> list[tuple[list[dict[str, Any]], int | None]]:
            nonlocal peak_active
            clients = [asyncio.create_task(stream_realtime(
                address, synthetic_pcm(2.0, seed=i), {"type": "start"})) for i in range(16)]
            while not all(c.done() for c in clients):
                stats = await asyncio.to_thread(get_stats, address)
                peak_active = max(peak_active, stats["streams"]["active"])
                await asyncio.sleep(0.1)
            return [c.result() for c in clients]

        results = asyncio.run(run_all())
        ids = set()
        for messages, close_code in results:
            assert messages[0]["type"] == "ready", messages[:2]
            ids.add(messages[0]["stream_id"])
            assert messages[-1]["type"] == "done" and messages[-1]["finish_reason"] == "stop"
            assert close_code == 1000
        assert len(ids) == 16
        assert peak_active >= 8  # the streams overlapped in the engine, not one after another
        wait_until(lambda: get_stats(address)["pool"]["num_used_blocks"] == 0,
                   what="pool back to full")
        stats = get_stats(address)
        assert stats["pool"]["num_free_blocks"] == stats["pool"]["num_blocks"] == 128
        assert stats["finish_reasons"]["stop"] == 16 and stats["streams"]["active"] == 0


DEVSET_FILES = ["tts_03.wav", "real_george_0.wav"]


@pytest.mark.skipif(not DEFAULT_MODEL_DIR.is_dir(),
                    reason="the bundled default model (oasr/assets/default_model) is not trained yet")
def test_real_speech_over_the_wire_matches_offline_transcription() -> None:
    references = dict(line.split("\t", 1) for line in
                      (DEVSET_DIR / "manifest.tsv").read_text().splitlines() if "\t" in line)
    pytest.importorskip("tokenizers")
    # the product's path: CTC partials (beam + LMs, as oasr-server decodes), Whisper finals
    # and its guard (the bundled model's CTC pass alone is trained on synthetic speech only;
    # docs/model.md has its own WER). No refined partials: their forced prefixes make a live
    # final depend on timing, and this test compares the wire with offline word for word.
    from oasr.decoding import GpuDecoderConfig
    from oasr.engine.options import default_beam_size

    engine = EngineConfig(device="cpu", max_batch_size=4, max_num_blocks=4 * 64,
                          second_pass="whisper", refine=None,
                          decoder=GpuDecoderConfig(beam_size=default_beam_size(None, "auto")))
    config = ServerConfig(port=0, engine=engine)
    paths = [DEVSET_DIR / name for name in DEVSET_FILES]
    offline = [r.text for r in transcribe_files(engine, paths, progress=False)]
    with live_server(config) as address:
        async def run_all() -> list[tuple[list[dict[str, Any]], int | None]]:
            return await asyncio.gather(*(stream_realtime(
                address, _wav_s16le(path), {"type": "start", "sample_rate": 16000})
                for path in paths))

        results = asyncio.run(run_all())
    for path, expected, (messages, close_code) in zip(paths, offline, results, strict=True):
        assert messages[-1]["finish_reason"] == "stop" and close_code == 1000
        text = final_text(messages)
        # the second pass's text (a digit string is combined from both passes)
        assert all(m["source"] in ("whisper", "combined") for m in messages if m["type"] == "final")
        # the same words as offline (batched float sums may flip a rare token)
        assert word_error_rate(expected, text) <= 0.1, (path.name, text, expected)
        assert word_error_rate(references[path.name].strip(), text) <= 0.2, (path.name, text)


def _wav_s16le(path: Path) -> bytes:
    samples = read_audio(path)
    return (samples * 32768).clip(-32768, 32767).astype("<i2").tobytes()


def test_run_prints_the_url_once_serving(make_config: Callable[..., ServerConfig],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = make_config(port=0)
    uvicorn_config = build_uvicorn_config(config)
    server = DrainingServer(uvicorn_config, uvicorn_config.app.state.context)
    thread = threading.Thread(target=asyncio.run, args=(_serve(server, config),), daemon=True)
    printed: list[str] = []
    thread.start()
    try:
        wait_until(lambda: printed.append(capsys.readouterr().out) or "ready" in "".join(printed),
                   60, "the ready line")
        port = server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
    assert f"open http://127.0.0.1:{port}/ and press the mic button" in "".join(printed)


def test_the_ready_line_waits_for_the_engines_calibration(
        make_config: Callable[..., ServerConfig], capsys: pytest.CaptureFixture[str]) -> None:
    """A client that connects when the line says "ready" is served, not refused busy while the
    engine still measures its step."""
    config = make_config(port=0)
    engine = EngineThread(config.engine, calibrate=True)
    calibrating, release = threading.Event(), threading.Event()
    calibrate = engine.engine.calibrate

    def held_calibrate() -> float:
        calibrating.set()
        release.wait(30)
        return calibrate()

    engine.engine.calibrate = held_calibrate  # type: ignore[method-assign]
    uvicorn_config = build_uvicorn_config(config, engine)
    server = DrainingServer(uvicorn_config, uvicorn_config.app.state.context)
    thread = threading.Thread(target=asyncio.run, args=(_serve(server, config),), daemon=True)
    printed: list[str] = []
    thread.start()
    try:
        wait_until(lambda: calibrating.is_set() and server.started, 60, "serving, calibrating")
        threading.Event().wait(0.3)  # the server's loop goes on while the engine calibrates
        printed.append(capsys.readouterr().out)
        assert "ready" not in "".join(printed)
        release.set()
        wait_until(lambda: printed.append(capsys.readouterr().out) or "ready" in "".join(printed),
                   60, "the ready line")
        assert engine.ready
    finally:
        release.set()
        server.should_exit = True
        thread.join(30)
