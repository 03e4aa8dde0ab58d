"""The demo page in Debian's Chromium against a real ``oasr-server`` process.

A fake microphone plays a wav once (``%noloop``); the page captures it at the AudioContext's
44.1 kHz and streams it. Every scenario leaves a screenshot in its pytest temp dir. Accuracy
(WER <= 35 %) is checked when the server runs the bundled model; with the random stand-in the
same scenarios check the mechanics only.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import soxr
from demo_page import CHROMIUM, DemoPage, sleep_page_time
from websockets.sync.client import connect

from oasr.text.wer import word_error_rate

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                       reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]

MAX_WER = 0.35
# Sentences the fake microphones speak (espeak-ng, synthesised here). The shared hello_48k.wav
# ("the quick brown fox...") measured 44-78 % WER through the browser with the bundled model of
# 07:27 UTC (22 % offline), so it only feeds the busy test, where no words are checked.
SECOND_TEXT = "call me when you arrive at the station"
THIRD_TEXT = "turn the volume down a little bit please"
FILE_NAME, FILE_TEXT = "tts_00.wav", "the weather is nice today so we will walk to the park"
TAIL_S = 0.5  # silence the fake mic plays after the sentence before the test stops it

OpenPage = Callable[..., DemoPage]


def wav_seconds(path: Path) -> float:
    info = soundfile.info(str(path))
    return info.frames / info.samplerate


def synthesise(text: str, sample_rate: int, out: Path) -> Path:
    """``text`` spoken by espeak-ng (en-us) after 0.3 s of silence, as 16-bit ``sample_rate``."""
    raw = out.with_suffix(".espeak.wav")
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(raw), text], check=True)
    samples, rate = soundfile.read(str(raw), dtype="float32")
    resampled = soxr.resample(samples, rate, sample_rate)  # (N,) float32
    lead = np.zeros(int(0.3 * sample_rate), dtype=np.float32)
    soundfile.write(str(out), np.concatenate([lead, resampled]), sample_rate, subtype="PCM_16")
    return out


@pytest.fixture(scope="module")
def sentences(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, str]]:
    """Two synthesised sentences for two fake microphones: 44.1 kHz and 48 kHz wavs."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    folder = tmp_path_factory.mktemp("tts")
    return [(synthesise(SECOND_TEXT, 44100, folder / "second_44k.wav"), SECOND_TEXT),
            (synthesise(THIRD_TEXT, 48000, folder / "third_48k.wav"), THIRD_TEXT)]


def assert_blocks_shown_while_live(page: DemoPage, stream_id: int, until_ms: float) -> None:
    live = [s for s in page.grid_samples() if s.t_ms <= until_ms and s.num_used > 0]
    assert live, "the pool grid never showed a block in use while the stream was live"
    assert any(str(stream_id) in s.owners for s in live), (
        f"no grid cell was owned by stream {stream_id}: owners seen "
        f"{sorted({o for s in live for o in s.owners})}")


def assert_finished(page: DemoPage, reason: str) -> None:
    """The done note, the status line and the panel's counter all show ``reason``."""
    note = page.wait_done()
    assert note.startswith(f"done: {reason}"), note
    assert page.status() == f"Finished ({reason}).", page.status()
    assert page.wait_finish_reason(reason) >= 1
    page.wait_grid_empty()


def test_mic_sentence_partial_then_final_words(open_page: OpenPage, bundled_model_dir: Path,
                                               sentences: list[tuple[Path, str]]) -> None:
    capture, reference = sentences[0]
    page = open_page(capture)
    page.start_mic()
    stream_id = page.wait_listening()
    sleep_page_time(wav_seconds(capture) / 2)
    page.screenshot("mic_speaking")
    sleep_page_time(wav_seconds(capture) / 2 + TAIL_S)
    stopped_at = page.now_ms()
    page.stop_mic()
    assert_finished(page, "stop")
    page.screenshot("mic_finished")

    assert_blocks_shown_while_live(page, stream_id, stopped_at)
    samples = page.transcript_samples()
    first_partial = next((s.t_ms for s in samples if s.partial), None)
    first_final = next((s.t_ms for s in samples if s.num_finals > 0), None)
    assert first_partial is not None, "no partial was shown while speaking"
    assert first_final is not None, "no final segment was shown"
    assert first_partial < first_final, (
        f"the first partial came {first_partial - first_final:.0f} ms after the first final")
    text = page.final_text()
    wer = word_error_rate(reference, text)
    assert wer <= MAX_WER, f"WER {wer:.0%} > {MAX_WER:.0%}: heard {text!r}"


def test_two_pages_are_two_streams(open_page: OpenPage, sentences: list[tuple[Path, str]],
                                   uses_bundled_model: bool) -> None:
    captures = [capture for capture, _ in sentences]
    pages = [open_page(capture) for capture in captures]
    for page in pages:
        page.start_mic()
    stream_ids = [page.wait_listening() for page in pages]
    assert stream_ids[0] != stream_ids[1]
    sleep_page_time(max(wav_seconds(c) for c in captures) + TAIL_S)
    pages[0].screenshot("two_pages_first_live")
    pages[1].screenshot("two_pages_second_live")
    stopped_at = [page.now_ms() for page in pages]
    for page in pages:
        page.stop_mic()
    for page in pages:
        assert_finished(page, "stop")
    pages[0].screenshot("two_pages_first_finished")

    for page, until in zip(pages, stopped_at, strict=True):
        shared = [s for s in page.grid_samples() if s.t_ms <= until and len(s.owners) == 2]
        assert shared, "the grid never showed blocks of two streams at once"
        assert {str(i) for i in stream_ids} == set(shared[-1].owners)
        assert len(shared[-1].colors) == 2, f"two owners in one colour: {shared[-1]}"
    texts = [page.final_text() for page in pages]
    assert all(texts), f"a page showed no final transcript: {texts}"
    if uses_bundled_model:
        for (_, reference), text in zip(sentences, texts, strict=True):
            wer = word_error_rate(reference, text)
            assert wer <= MAX_WER, f"WER {wer:.0%} > {MAX_WER:.0%}: heard {text!r}"


def test_file_button_streams_a_file(open_page: OpenPage, devset_dir: Path,
                                    uses_bundled_model: bool) -> None:
    path = devset_dir / FILE_NAME
    page = open_page()
    page.stream_file(path)
    stream_id = page.wait_listening()
    run_label = page.page.locator("#transcript .run .run-label").last.inner_text()
    assert run_label.startswith(FILE_NAME), run_label
    sleep_page_time(wav_seconds(path) / 2)
    page.screenshot("file_streaming")
    assert_finished(page, "stop")
    page.screenshot("file_finished")
    assert_blocks_shown_while_live(page, stream_id, page.now_ms())
    text = page.final_text()
    assert text, "no final transcript for the file"
    if uses_bundled_model:
        wer = word_error_rate(FILE_TEXT, text)
        assert wer <= MAX_WER, f"WER {wer:.0%} > {MAX_WER:.0%}: heard {text!r}"


@contextmanager
def slots_held(ws_url: str, num_streams: int) -> Iterator[None]:
    """Hold ``num_streams`` stream slots with websocket clients sending silence in real time."""
    stop = threading.Event()
    ready = threading.Barrier(num_streams + 1, timeout=60)
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with connect(ws_url, open_timeout=30) as ws:
                ws.send('{"type": "start"}')
                assert '"ready"' in str(ws.recv(timeout=30))
                ready.wait()
                while not stop.wait(0.1):
                    ws.send(bytes(3200))  # 100 ms of 16 kHz s16le silence
                ws.send('{"type": "end"}')
                for _ in ws:  # until the server closes after done
                    pass
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(num_streams)]
    for thread in threads:
        thread.start()
    try:
        ready.wait()
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors, f"a slot holder failed: {errors!r}"


def test_full_server_refuses_the_page(open_page: OpenPage, demo_server: Any,
                                      devset_dir: Path) -> None:
    page = open_page(devset_dir / "e2e" / "hello_48k.wav")
    refused_before = demo_server.stats()["num_refused"]
    with slots_held(demo_server.ws_url, num_streams=2):
        page.start_mic()
        page.page.wait_for_function(
            "document.getElementById('status').dataset.kind === 'error'")
        page.screenshot("server_busy")
        status = page.status()
        assert "busy" in status, status
        assert "busy" in page.page.locator("#transcript .note.error").last.inner_text()
        assert page.page.get_attribute("#mic", "aria-pressed") == "false"
        page.page.wait_for_timeout(500)  # level callbacks still queued when the mic stopped
        meter = page.page.eval_on_selector("[data-meter]", "el => el.style.width")
        assert meter in ("", "0%"), f"the level meter stays lit after the refusal: {meter}"
    assert demo_server.stats()["num_refused"] == refused_before + 1


def test_denied_microphone_is_explained(open_page: OpenPage, demo_server: Any) -> None:
    page = open_page(deny_mic=True)
    connections_before = demo_server.stats()["server"]["connections"]
    page.start_mic()
    page.page.wait_for_function("document.getElementById('status').dataset.kind === 'error'")
    page.screenshot("mic_denied")
    status = page.status()
    assert "denied" in status, status
    assert page.page.get_attribute("#mic", "aria-pressed") == "false"
    assert page.page.locator("#transcript .run").count() == 0, "a stream was opened anyway"
    assert demo_server.stats()["server"]["connections"] == connections_before
