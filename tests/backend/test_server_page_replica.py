"""The page names the replica its stream landed on, and shows a draining server."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from server_helpers import live_server
from support.servers import launch_server
from test_server_page import CHROMIUM, launch, sync_api, write_wav
from websockets.sync.client import connect

from backend.config import ServerConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120),
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no Debian chromium")]


def test_page_names_the_replica_of_its_stream(make_config: Callable[..., ServerConfig],
                                              tmp_path: Path) -> None:
    capture = write_wav(tmp_path / "speech.wav", 3.0)
    config = make_config(port=0, stats_interval_s=0.1, replica="oasr-b")
    with live_server(config) as address, sync_api.sync_playwright() as playwright:
        context = launch(playwright, tmp_path, capture)
        page = context.new_page()
        page.goto(f"http://{address}/")
        page.wait_for_function(
            "document.querySelector('[data-field=replica]').textContent === 'oasr-b'")
        page.click("#mic")
        page.wait_for_function(
            "document.getElementById('status').textContent.includes('on replica oasr-b')")
        page.wait_for_function("document.querySelector('[data-field=replica]').textContent"
                               " === 'oasr-b (your stream runs here)'")
        page.click("#mic")
        page.wait_for_function(
            "document.getElementById('status').textContent === 'Finished (stop).'",
            timeout=20_000)
        context.close()


def test_page_shows_a_draining_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = launch_server(tiny_model_dir, ("--replica", "oasr-c", "--stats-interval", "0.1",
                                            "--max-batch-size", "2", "--max-num-blocks", "16",
                                            "--num-left-chunks", "-1"),
                           tmp_path / "server.log")
    try:
        with sync_api.sync_playwright() as playwright, connect(server.ws_url) as session:
            context = launch(playwright, tmp_path, capture=None)
            page = context.new_page()
            page.goto(server.url)
            page.wait_for_function(
                "document.querySelector('[data-field=replica]').textContent === 'oasr-c'")
            session.send(json.dumps({"type": "start"}))  # a live session keeps the drain going
            assert json.loads(session.recv(timeout=30))["type"] == "ready"
            server.process.send_signal(signal.SIGTERM)
            page.wait_for_function(
                "document.querySelector('[data-field=replica]').textContent"
                ".startsWith('oasr-c · draining (')")
            context.close()
            session.send(json.dumps({"type": "end"}))
        assert server.process.wait(30) == 0
    finally:
        if server.is_running():
            server.process.kill()
            server.process.wait(30)
