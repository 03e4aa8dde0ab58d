"""The demo page keeps working when the server requires API keys.

The page asks for a key once (a ``window.prompt``), trades it at ``POST /api/token`` for a
short-lived token and offers only that token to ``/ws/stats`` and ``/ws/asr``. A wrong key is
refused and asked for again.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from demo_page import CHROMIUM, DemoPage, browser_args

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                       reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]
KEY = "sk-page-test"
SERVER_FLAGS = ("--max-batch-size", "2", "--max-num-blocks", "64", "--api-key", KEY)


@pytest.fixture(scope="module")
def demo_server(start_module_server: Callable[..., Any], random_model_dir: Path) -> Any:
    server = start_module_server(random_model_dir, *SERVER_FLAGS)
    server.api_key = KEY
    return server


def test_page_with_keys_streams_a_file(playwright: Any, demo_server: Any, tmp_path: Path,
                                       devset_dir: Path) -> None:
    context = playwright.chromium.launch_persistent_context(
        str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
        args=browser_args(None))
    answers = ["sk-wrong", KEY]
    prompts: list[str] = []

    def answer(dialog: Any) -> None:
        prompts.append(dialog.message)
        dialog.accept(answers[min(len(prompts), len(answers)) - 1])

    try:
        page = context.new_page()
        page.on("dialog", answer)
        demo = DemoPage(page, demo_server.url, tmp_path)  # waits for the stats socket
        assert prompts == ["This oasr server needs an API key:"] * 2
        tokens = page.evaluate("performance.getEntriesByType('resource')"
                               ".filter((e) => e.name.endsWith('/api/token')).length")
        assert tokens >= 2
        demo.stream_file(devset_dir / "tts_00.wav")
        demo.wait_listening()
        assert "done: stop" in demo.wait_done()
        assert len(prompts) == 2  # the stored key is not asked for again
        demo.screenshot("page_with_keys")
    finally:
        context.close()
    demo_server.wait_until_idle(timeout_s=30)
