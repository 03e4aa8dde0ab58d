"""A dropped socket in Debian's Chromium: the page streams a held-out recording through a TCP
proxy, the proxy resets the /ws/asr connection half way through the speech and refuses new ones
for 2 s (a Wi-Fi blip), and the page reconnects by itself and resumes the same stream.

The pool panel shows the stream suspended while its page is away, and each stream's lag."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cut_proxy import CutProxy
from demo_page import CHROMIUM, DemoPage, sleep_page_time
from test_demo_page import MAX_WER, wav_seconds

from oasr.text.wer import word_error_rate

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                       reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]

RECORDING = "real_jfk.wav"
REFERENCE = ("and so my fellow americans ask not what your country can do for you ask what you "
             "can do for your country")
DOWN_S = 2.0  # new /ws/asr connections are refused this long after the cut
# conftest's server: two slots, a 64-block pool
SERVER_FLAGS = ("--max-batch-size", "2", "--max-num-blocks", "64", "--max-wait", "0",
                "--max-connections", "8")
# every message the page's /ws/asr sockets receive, in order, across its reconnections
RECORD_MESSAGES_JS = """
(() => {
  const Native = window.WebSocket;
  window.__asrMessages = [];
  window.WebSocket = class extends Native {
    constructor(url, protocols) {
      super(url, protocols);
      if (String(url).includes("/ws/asr")) {
        this.addEventListener("message", (event) => {
          if (typeof event.data === "string") window.__asrMessages.push(JSON.parse(event.data));
        });
      }
    }
  };
})();
"""
OpenPage = Callable[..., DemoPage]


@pytest.fixture(scope="module")
def served(start_module_server: Callable[..., Any], random_model_dir: Path,
           uses_bundled_model: bool) -> Iterator[tuple[Any, CutProxy]]:
    """The conftest's e2e server and a proxy in front of it."""
    server = start_module_server(None if uses_bundled_model else random_model_dir,
                                 *SERVER_FLAGS)
    proxy = CutProxy(server.address)
    yield server, proxy
    proxy.close()


@pytest.fixture(scope="module")
def demo_server(served: tuple[Any, CutProxy]) -> Any:
    """The server as the pages reach it: through the proxy (overrides conftest's)."""
    server, proxy = served
    return dataclasses.replace(server, address=proxy.address)


def test_a_socket_cut_mid_speech_is_resumed_by_the_page(
        open_page: OpenPage, served: tuple[Any, CutProxy], devset_dir: Path,
        uses_bundled_model: bool) -> None:
    _, proxy = served
    page = open_page()
    page.page.add_init_script(RECORD_MESSAGES_JS)
    page.page.reload()
    page.page.wait_for_function(
        "document.querySelector('[data-connection]').textContent === 'connected'")
    path = devset_dir / RECORDING
    page.stream_file(path)
    stream_id = page.wait_listening()
    page.page.wait_for_selector(f"[data-legend] .lag[data-stream='{stream_id}']")
    sleep_page_time(wav_seconds(path) / 2)
    assert proxy.cut("/ws/asr", down_s=DOWN_S) == 1
    page.page.wait_for_function(  # the server keeps the stream while the page is away
        "document.querySelector('[data-field=suspended]').textContent === '1'", timeout=5_000)
    page.page.wait_for_function("document.getElementById('status').textContent"
                                ".includes('resumed after a dropped connection')",
                                timeout=15_000)
    page.screenshot("resumed")
    note = page.wait_done()
    page.screenshot("resumed_finished")
    assert note.startswith("done: stop"), note

    messages = page.page.evaluate("window.__asrMessages")
    readies = [m for m in messages if m["type"] == "ready"]
    assert len(readies) == 2 and readies[1]["resumed"] is True, readies
    assert readies[1]["stream_id"] == readies[0]["stream_id"] == stream_id
    assert 0 < readies[1]["received_samples"] < 16000 * wav_seconds(path)
    segments = [m["segment"] for m in messages if m["type"] == "final"]
    assert segments and len(segments) == len(set(segments)), segments  # none twice
    assert page.field("suspended") == "0"
    text = page.final_text()
    assert text, "no final transcript"
    if uses_bundled_model:
        wer = word_error_rate(REFERENCE, text)
        assert wer <= MAX_WER, f"WER {wer:.0%} > {MAX_WER:.0%}: heard {text!r}"
