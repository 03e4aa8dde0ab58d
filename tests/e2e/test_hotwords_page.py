"""The demo page's hotwords field and word hover, in Debian's Chromium against oasr-server: the
field's terms go with the stream's start (ready echoes them in the status line), Enter while
streaming replaces them (the server's answer is noted in the transcript), and every word of a
final carries its time and confidence as its title."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from demo_page import CHROMIUM, DemoPage, sleep_page_time

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                       reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]

OpenPage = Callable[..., DemoPage]


def test_hotwords_field_goes_with_the_stream_and_words_show_their_confidence(
        open_page: OpenPage, devset_dir: Path) -> None:
    page = open_page()
    field = page.page.locator("#hotwords")
    assert field.is_visible()
    field.fill("Brenvik, Taloria")
    page.stream_file(devset_dir / "real_jfk.wav")
    page.wait_listening()
    assert "hotwords: Brenvik, Taloria" in page.status(), page.status()
    sleep_page_time(2.0)
    field.fill("Quenmarsh")
    field.press("Enter")
    note = page.page.locator("#transcript .run").last.locator(
        ".note", has_text="hotwords from here on: Quenmarsh")
    note.wait_for(timeout=30_000)
    page.wait_done(timeout_ms=120_000)
    page.screenshot("hotwords_finished")
    titles = page.page.evaluate(
        "[...document.querySelectorAll('#transcript .run:last-of-type .segment.final .word')]"
        ".map((node) => node.title)")
    assert titles, "no word spans in the finals"
    pattern = re.compile(r"^\d+\.\d\d-\d+\.\d\d s, confidence \d+ %$")
    assert all(pattern.match(t) for t in titles), titles[:5]
