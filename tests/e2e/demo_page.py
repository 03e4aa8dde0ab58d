"""The demo page driven by Playwright: launch recipe, instrumentation and what the page shows.

``DemoPage`` wraps one Playwright page of the demo. An init script installed before the page's
own modules records, with ``performance.now()`` times, every change of the transcript (the live
partial's text, the number of finished segments) and of the block grid (cells in use, their
owners and colours), so a test can assert on order and on what was visible while it happened.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# Chromium's fake-microphone flags, plus /tmp instead of a container's small /dev/shm for shared memory.
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                "--disable-dev-shm-usage"]
UI_TIMEOUT_MS = 30_000

_RECORDER_JS = """
(() => {
  const log = [];
  window.__oasrLog = log;
  function watch() {
    const transcript = document.getElementById("transcript");
    const grid = document.querySelector("[data-grid]");
    new MutationObserver(() => {
      const partial = transcript.querySelector(".segment.partial");
      log.push({t: performance.now(), kind: "transcript",
                partial: partial ? partial.textContent : null,
                finals: transcript.querySelectorAll(".segment.final").length});
    }).observe(transcript, {subtree: true, childList: true, characterData: true,
                            attributes: true});
    new MutationObserver(() => {
      const used = [...grid.querySelectorAll(".cell.used")];
      log.push({t: performance.now(), kind: "grid", used: used.length,
                owners: [...new Set(used.map((cell) => cell.dataset.owner))],
                colors: [...new Set(used.map((cell) => cell.style.background))]});
    }).observe(grid, {subtree: true, childList: true, attributes: true});
    const status = document.getElementById("status");
    new MutationObserver(() => {
      log.push({t: performance.now(), kind: "status", text: status.textContent,
                level: status.dataset.kind || ""});
    }).observe(status, {subtree: true, childList: true, characterData: true,
                        attributes: true});
  }
  document.addEventListener("DOMContentLoaded", watch);
})();
"""


def browser_args(capture_wav: Path | None, deny_mic: bool = False) -> list[str]:
    """Chromium flags: a fake microphone playing ``capture_wav`` once, or a denied prompt."""
    args = list(BROWSER_ARGS)
    if deny_mic:
        return [*args, "--use-fake-device-for-media-stream", "--deny-permission-prompts"]
    if capture_wav is not None:
        args += ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                 f"--use-file-for-fake-audio-capture={capture_wav}%noloop"]
    return args


@dataclass(frozen=True)
class GridSample:
    """One recorded state of the block grid."""

    t_ms: float
    num_used: int
    owners: tuple[str, ...]
    colors: tuple[str, ...]


@dataclass(frozen=True)
class TranscriptSample:
    """One recorded state of the transcript: the live partial's text and the finals' count."""

    t_ms: float
    partial: str | None
    num_finals: int


class DemoPage:
    """One tab of the demo (a Playwright ``Page`` with the recorder installed)."""

    def __init__(self, page: Any, url: str, screenshot_dir: Path) -> None:
        self.page = page
        self.screenshot_dir = screenshot_dir
        page.add_init_script(_RECORDER_JS)
        page.set_default_timeout(UI_TIMEOUT_MS)
        page.goto(url)
        page.wait_for_function(
            "document.querySelector('[data-connection]').textContent === 'connected'")
        page.wait_for_selector("[data-grid] .cell", state="attached")

    def screenshot(self, name: str) -> Path:
        """Save a full-page PNG under the test's temp dir; returns its path."""
        path = self.screenshot_dir / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    # -- actions ---------------------------------------------------------------------------
    def start_mic(self) -> None:
        self.page.click("#mic")

    def wait_listening(self) -> int:
        """Wait for the server's ready; returns the stream id the status line named then."""
        self.page.wait_for_function(
            "window.__oasrLog.some((e) => e.kind === 'status' && e.level === 'live'"
            " && /stream \\d+/.test(e.text))")
        live = [e["text"] for e in self._log() if e["kind"] == "status" and e["level"] == "live"]
        match = re.search(r"stream (\d+)", live[-1])
        assert match, f"no stream id in the status line {live[-1]!r}"
        return int(match.group(1))

    def stop_mic(self) -> None:
        assert self.page.get_attribute("#mic", "aria-pressed") == "true", "the mic is not on"
        self.page.click("#mic")

    def stream_file(self, path: Path) -> None:
        """Press the file button and pick ``path`` in the file chooser."""
        with self.page.expect_file_chooser() as chooser:
            self.page.click("#file-button")
        chooser.value.set_files(str(path))

    def done_note(self) -> Any:
        """The latest run's ``done`` note (absent until the run is done)."""
        return self.page.locator("#transcript .run").last.locator(".note", has_text="done:")

    def wait_done(self, timeout_ms: int = 60_000) -> str:
        """Wait for the run's ``done`` note; returns its text (``done: stop, 1 segment(s)``)."""
        note = self.done_note()
        note.wait_for(timeout=timeout_ms)
        return note.inner_text()

    def wait_grid_empty(self) -> None:
        self.page.wait_for_function(
            "document.querySelectorAll('[data-grid] .cell.used').length === 0"
            " && document.querySelector('[data-field=occupancy]').textContent.startsWith('0 /')")

    # -- what the page shows ---------------------------------------------------------------
    def status(self) -> str:
        return self.page.inner_text("#status")

    def final_text(self) -> str:
        """The finished segments of the latest run, joined by spaces."""
        return self.page.evaluate(
            "[...document.querySelectorAll('#transcript .run:last-of-type .segment.final .words')]"
            ".map((node) => node.textContent).join(' ')")

    def field(self, name: str) -> str:
        return self.page.inner_text(f"[data-field={name}]")

    def finish_reason_count(self, reason: str) -> int:
        item = self.page.locator("[data-reasons] li", has=self.page.locator(
            ".reason", has_text=re.compile(f"^{reason}$")))
        return int(item.locator(".count").inner_text())

    def wait_finish_reason(self, reason: str, timeout_ms: int = 10_000) -> int:
        """The panel's count of streams that finished for ``reason``, once it is at least 1
        (the panel shows the engine's snapshots as they are pushed, a moment after the
        stream's own ``done``); raises when it stays 0 for ``timeout_ms``."""
        self.page.wait_for_function(
            """(reason) => [...document.querySelectorAll('[data-reasons] li')].some(
                li => li.querySelector('.reason').textContent === reason
                      && Number(li.querySelector('.count').textContent) >= 1)""",
            arg=reason, timeout=timeout_ms)
        return self.finish_reason_count(reason)

    def grid_samples(self) -> list[GridSample]:
        return [GridSample(e["t"], e["used"], tuple(e["owners"]), tuple(e["colors"]))
                for e in self._log() if e["kind"] == "grid"]

    def transcript_samples(self) -> list[TranscriptSample]:
        return [TranscriptSample(e["t"], e["partial"], e["finals"])
                for e in self._log() if e["kind"] == "transcript"]

    def now_ms(self) -> float:
        return float(self.page.evaluate("performance.now()"))

    def _log(self) -> list[dict[str, Any]]:
        return self.page.evaluate("window.__oasrLog")


def sleep_page_time(seconds: float) -> None:
    """Let the page run (the fake microphone plays in real time)."""
    time.sleep(seconds)


