"""The page in Debian's Chromium (Playwright) against a live server: mic, file, busy."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
from server_helpers import get_stats, live_server, synthetic_pcm
from support.paths import DEVSET_DIR
from websockets.sync.client import connect

from backend.config import ServerConfig

CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed"),
]
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture
def address(make_config: Callable[..., ServerConfig]) -> Iterator[str]:
    with live_server(make_config(port=0, stats_interval_s=0.1)) as address:
        yield address


def launch(playwright: object, tmp_path: Path, capture: Path | None) -> object:
    args = list(BROWSER_ARGS)
    if capture is not None:
        args += ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                 f"--use-file-for-fake-audio-capture={capture}%noloop"]
    return playwright.chromium.launch_persistent_context(  # type: ignore[attr-defined]
        str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=args)


def write_wav(path: Path, seconds: float) -> Path:
    """A 16-bit wav for Chromium's fake microphone."""
    soundfile.write(path, np.frombuffer(synthetic_pcm(seconds), "<i2"), 16000, subtype="PCM_16")
    return path


def test_mic_run_fills_the_grid_then_finishes(address: str, tmp_path: Path) -> None:
    capture = write_wav(tmp_path / "speech.wav", 3.0)
    with sync_api.sync_playwright() as playwright:
        context = launch(playwright, tmp_path, capture)
        page = context.new_page()
        page.goto(f"http://{address}/")
        page.wait_for_selector("[data-connection][data-state='live']")
        page.wait_for_function("document.querySelector('[data-grid]').dataset.numBlocks === '16'")
        page.click("#mic")
        page.wait_for_function(
            "document.getElementById('status').textContent.startsWith('Listening')")
        assert page.get_attribute("#mic", "aria-pressed") == "true"
        assert re.fullmatch(r"mic \(\d+ Hz\)", page.inner_text(".run-label"))
        page.wait_for_function(  # this tab's blocks, drawn outlined in the grid
            "Number(document.querySelector('[data-grid]').dataset.numMine) > 0", timeout=10_000)
        page.wait_for_timeout(1500)
        page.click("#mic")  # stop: flush, end, wait for the final words
        page.wait_for_function(
            "document.getElementById('status').textContent === 'Finished (stop).'",
            timeout=20_000)
        assert page.get_attribute("#mic", "aria-pressed") == "false"
        assert page.locator(".segment.final").count() >= 1
        assert page.locator(".segment.partial").count() == 0
        assert "done: stop" in page.inner_text("#transcript")
        page.wait_for_function(
            "document.querySelector('[data-field=occupancy]').textContent.startsWith('0 / 16')")
        assert page.get_attribute("[data-grid]", "data-num-used") == "0"
        context.close()
    assert get_stats(address)["finish_reasons"]["stop"] == 1


def test_file_button_streams_through_the_same_path(address: str, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as playwright:
        context = launch(playwright, tmp_path, capture=None)
        page = context.new_page()
        page.goto(f"http://{address}/")
        page.set_input_files("#file", str(DEVSET_DIR / "tts_10.wav"))
        page.wait_for_function(
            "document.getElementById('status').textContent.startsWith('Streaming tts_10.wav')")
        assert page.is_disabled("#mic") and page.is_visible("#stop-file")
        page.wait_for_function(
            "document.getElementById('status').textContent === 'Finished (stop).'",
            timeout=30_000)
        assert page.inner_text(".run-label").startswith("tts_10.wav (")
        assert page.locator(".segment.final").count() >= 1
        assert not page.is_disabled("#mic")
        context.close()


def test_a_full_server_is_reported_busy(address: str, tmp_path: Path) -> None:
    with contextlib.ExitStack() as holders:
        for _ in range(2):  # both slots taken
            ws = holders.enter_context(connect(f"ws://{address}/ws/asr"))
            ws.send(json.dumps({"type": "start"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "ready"
        capture = write_wav(tmp_path / "speech.wav", 1.0)
        with sync_api.sync_playwright() as playwright:
            context = launch(playwright, tmp_path, capture)
            page = context.new_page()
            page.goto(f"http://{address}/")
            page.keyboard.press("Tab")  # the mic button is the first stop, Enter presses it
            assert page.evaluate("document.activeElement.id") == "mic"
            page.keyboard.press("Enter")
            page.wait_for_function(
                "document.getElementById('status').textContent.startsWith('The server is busy')")
            assert page.get_attribute("#status", "data-kind") == "error"
            assert page.get_attribute("#mic", "aria-pressed") == "false"
            context.close()


def test_transcript_keeps_segments_in_order_when_a_final_comes_late(
        address: str, tmp_path: Path) -> None:
    """With a second pass, segment 0's final can follow segment 1's partials."""
    script = """async () => {
      const { TranscriptView } = await import("/js/transcript.js");
      const root = document.createElement("div");
      const view = new TranscriptView(root);
      view.beginRun("test");
      view.partial({segment: 0, text: "hello wor"});
      view.partial({segment: 1, text: "how are"});
      view.final({segment: 0, text: "hello world", start: 0, end: 1.2, source: "whisper"});
      view.partial({segment: 1, text: "how are you"});
      const shown = () => [...root.querySelectorAll(".segment")].map(
          (l) => [l.dataset.segment, l.classList.contains("final") ? "final" : "partial",
                  (l.querySelector(".words") || l).textContent]);
      const before = shown();
      view.partial({segment: 2, text: "never finalised"});
      view.final({segment: 1, text: "how are you", start: 1.5, end: 2.5, source: "ctc"});
      view.note("done: stop, 2 segment(s)");
      return {before, after: shown(), tags: root.querySelectorAll(".source").length};
    }"""
    with sync_api.sync_playwright() as playwright:
        context = launch(playwright, tmp_path, capture=None)
        page = context.new_page()
        page.goto(f"http://{address}/")
        result = page.evaluate(script)
        context.close()
    assert result["before"] == [["0", "final", "hello world"], ["1", "partial", "how are you"]]
    assert result["after"] == [["0", "final", "hello world"], ["1", "final", "how are you"]]
    assert result["tags"] == 1
