"""End-to-end fixtures: one ``oasr-server`` process per module and Chromium pages against it.

The server serves the bundled default model when it is present (accuracy checks run), else a
seeded random model (only the mechanics are checked; accuracy checks skip). Two stream slots
and ``--max-wait 0``: two pages run at once and a third stream is refused ``busy`` at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from demo_page import CHROMIUM, DemoPage, browser_args

E2E_SERVER_FLAGS = ("--max-batch-size", "2", "--max-num-blocks", "64", "--max-wait", "0",
                    "--max-connections", "8")
BUNDLED_MODEL_CONFIG = Path(__file__).resolve().parents[2] / "oasr/assets/default_model/config.json"


@pytest.fixture(scope="module")
def uses_bundled_model() -> bool:
    """True when the server below serves the trained default model (accuracy is checked)."""
    return BUNDLED_MODEL_CONFIG.is_file()


@pytest.fixture(scope="module")
def demo_server(start_module_server: Callable[..., Any], random_model_dir: Path,
                uses_bundled_model: bool) -> Any:
    """The ``oasr-server`` process the pages talk to (a ``ServerProcess``)."""
    model_dir = None if uses_bundled_model else random_model_dir
    return start_module_server(model_dir, *E2E_SERVER_FLAGS)


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as driver:
        yield driver


@pytest.fixture
def open_page(playwright: Any, demo_server: Any, tmp_path: Path) -> Iterator[
        Callable[..., DemoPage]]:
    """Open the demo in a fresh Chromium profile per call; the fake mic plays ``capture``.

    At teardown every browser is closed and the server must be idle again (all blocks free,
    no stream, no connection).
    """
    contexts: list[Any] = []

    def open_(capture: Path | None = None, deny_mic: bool = False) -> DemoPage:
        profile = tmp_path / f"profile{len(contexts)}"
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True,
            args=browser_args(capture, deny_mic))
        contexts.append(context)
        return DemoPage(context.new_page(), demo_server.url, tmp_path)

    yield open_
    for context in contexts:
        context.close()
    demo_server.wait_until_idle(timeout_s=30)
