"""The engine panel at demo scale, in Debian's Chromium against a real ``oasr-server``.

The server here has a pool of 1,024 blocks (the demo's default pool is thousands) and the
commands' default attention history (8 chunks), so a few seconds of speech fill only a sliver of
the pool and evict: the grid must zoom on the blocks in use and show the pool's total beside
it, the batch chart must follow the steps, and two pages whose chunks are ready together must
show steps that ran both streams in one forward.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from demo_page import CHROMIUM, DemoPage, sleep_page_time

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                       reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]

NUM_BLOCKS = 1024
PANEL_SERVER_FLAGS = ("--max-batch-size", "2", "--max-num-blocks", str(NUM_BLOCKS),
                      "--max-wait", "0", "--max-connections", "8")
OpenPage = Callable[..., DemoPage]


@pytest.fixture(scope="module")
def demo_server(start_module_server: Callable[..., Any], random_model_dir: Path,
                uses_bundled_model: bool) -> Any:
    """``oasr-server`` with a 1,024-block pool (overrides conftest's 64-block one)."""
    return start_module_server(None if uses_bundled_model else random_model_dir,
                               *PANEL_SERVER_FLAGS)


def joined_speech(devset_dir: Path, names: list[str], out: Path) -> Path:
    """Devset clips back to back (their own short pauses only: no endpoint), 16-bit 16 kHz."""
    pieces = [soundfile.read(str(devset_dir / name), dtype="float32")[0] for name in names]
    lead = np.zeros(4800, dtype=np.float32)  # 0.3 s before the speech
    soundfile.write(str(out), np.concatenate([lead, *pieces]), 16000, subtype="PCM_16")
    return out


def grid_state(page: DemoPage) -> dict[str, Any]:
    return page.page.evaluate("""() => {
      const grid = document.querySelector('[data-grid]');
      const bar = document.querySelector('[data-overview]');
      const chart = document.querySelector('[data-batch-chart]');
      return {numBlocks: Number(grid.dataset.numBlocks), numUsed: Number(grid.dataset.numUsed),
              viewSize: Number(grid.dataset.viewSize), cells: grid.querySelectorAll('.cell').length,
              usedCells: grid.querySelectorAll('.cell.used').length,
              barBlocks: Number(bar.dataset.numBlocks), barUsed: Number(bar.dataset.numUsed),
              caption: document.querySelector('[data-overview-caption]').textContent,
              series: chart.dataset.series || '', lastStep: Number(chart.dataset.lastStep || 0),
              bars: chart.querySelectorAll('rect.bar').length,
              evictions: Number(document.querySelector('[data-field=evictions]').textContent),
              history: document.querySelector('[data-field=history]').textContent};
    }""")


def test_grid_zooms_on_the_blocks_in_use_and_the_chart_follows_the_steps(
        open_page: OpenPage, devset_dir: Path, demo_server: Any, tmp_path: Path) -> None:
    capture = joined_speech(devset_dir, [f"tts_0{i}.wav" for i in range(5)],
                            tmp_path / "five_sentences.wav")  # ~13 s of speech
    page = open_page(capture)
    idle = grid_state(page)
    assert idle["numBlocks"] == NUM_BLOCKS and idle["barBlocks"] == NUM_BLOCKS
    assert idle["cells"] < NUM_BLOCKS, "the grid shows the whole 1,024-block pool"
    assert idle["history"].startswith("8 chunks"), idle["history"]
    # admission as the server prices it: both free slots, and the step's measured cost
    page.page.wait_for_function(
        "/^2 more · a step \\d+\\.\\d ms \\+ \\d+\\.\\d ms per second of audio$/"
        ".test(document.querySelector('[data-field=admission]').textContent)", timeout=10_000)
    streams = demo_server.stats()["streams"]
    assert streams["admissible"] == 2 and streams["cost_per_audio_s"] > 0, streams
    assert f"{1000 * streams['cost_per_audio_s']:.1f} ms per second" in page.field("admission")
    page.start_mic()
    page.wait_listening()
    page.page.wait_for_function(
        "Number(document.querySelector('[data-grid]').dataset.numUsed) > 0")
    sleep_page_time(1.5)
    early = grid_state(page)
    sleep_page_time(2.0)
    later = grid_state(page)
    for state in (early, later):
        # every block in use is on the grid, in a window far smaller than the pool
        assert state["usedCells"] == state["numUsed"] == state["barUsed"] > 0, state
        assert 64 <= state["cells"] == state["viewSize"] < NUM_BLOCKS, state
        assert f"of {NUM_BLOCKS:,} blocks in use" in state["caption"], state["caption"]
        assert state["series"] and state["bars"] == len(state["series"].split(",")), state
    assert later["lastStep"] > early["lastStep"], "the batch chart did not follow the steps"
    assert len(later["series"].split(",")) > len(early["series"].split(","))
    # past 8 chunks (5.1 s) of one segment the stream evicts its oldest blocks, and the grid
    # outlines each freed block for a moment
    page.page.wait_for_function(
        "Number(document.querySelector('[data-field=evictions]').textContent) > 0",
        timeout=20_000)
    page.page.wait_for_selector("[data-grid] .cell.evicted", state="attached", timeout=10_000)
    page.screenshot("panel_evicting")
    page.stop_mic()
    page.wait_done()
    page.wait_grid_empty()
    assert grid_state(page)["evictions"] > 0
    # the second pass's panel: finals by source when it runs, refinement only when reported
    second = demo_server.stats()["second_pass"]
    if second["enabled"]:
        page.page.wait_for_function(
            "[...document.querySelectorAll('[data-sp-sources] .count')]"
            ".reduce((n, c) => n + Number(c.textContent), 0) >= 1")
    shown = page.page.evaluate("""() => {
      const root = document.querySelector('[data-second-pass]');
      const count = (key) => {
        const chip = root.querySelector(`[data-sp-fallbacks] [data-key=${key}] .count`);
        return chip === null ? null : Number(chip.textContent);
      };
      return {enabled: root.dataset.enabled === 'true',
              refineHidden: root.querySelector('[data-sp-refine]').hidden,
              expired: count('expired')};
    }""")
    assert shown["enabled"] == second["enabled"]
    if second["enabled"]:  # finals given up while the streams were behind: none at demo load
        assert shown["expired"] == second["num_expired"] == 0
        # decodes redone without the previous segment's text, as the server counts them
        retries = demo_server.stats()["second_pass"]["num_context_retries"]
        page.page.wait_for_function(
            "n => Number(document.querySelector("
            "'[data-sp-fallbacks] [data-key=context_retries] .count').textContent) === n",
            arg=retries, timeout=5_000)
    assert shown["refineHidden"] == (not second.get("refine", False))


def test_two_pages_with_chunks_ready_together_show_a_batch_of_two(
        open_page: OpenPage, devset_dir: Path, demo_server: Any, tmp_path: Path) -> None:
    """Two pages speaking at once are stepped together whenever both have a chunk ready.

    At real-time pace an idle engine steps each stream the moment its 640 ms chunk is in, a
    few ms later; two tabs' chunks complete at moments set by when each tab started, so they
    share a step only when those moments fall within one step of each other (measured: some
    runs never, some a few steps in a row). Here the server is paused for 2 s while both
    speak, as a long step or a busy box would: then both have chunks waiting, the next steps
    take both in one forward, and both pages' charts must say so.
    """
    captures = [joined_speech(devset_dir, names, tmp_path / f"speech{i}.wav") for i, names in
                enumerate([["tts_00.wav", "tts_02.wav"], ["tts_05.wav", "tts_11.wav"]])]
    pages = [open_page(capture) for capture in captures]
    for page in pages:
        page.start_mic()
    stream_ids = [page.wait_listening() for page in pages]
    for page in pages:
        page.page.wait_for_function(
            "new Set([...document.querySelectorAll('[data-grid] .cell.used')]"
            ".map((c) => c.dataset.owner)).size === 2")
    os.kill(demo_server.process.pid, signal.SIGSTOP)
    try:
        sleep_page_time(2.0)
    finally:
        os.kill(demo_server.process.pid, signal.SIGCONT)
    for page in pages:
        page.page.wait_for_function(
            "(document.querySelector('[data-batch-chart]').dataset.series || '')"
            ".split(',').includes('2')", timeout=15_000)
        assert page.page.locator("[data-batch-chart] rect.batched").count() >= 1
        assert "ran more than one stream" in page.page.inner_text("[data-batch-caption]")
    pages[0].screenshot("two_pages_batched")
    assert 2 in demo_server.stats()["step"]["recent_batch_sizes"]
    for page in pages:
        page.stop_mic()
    for page in pages:
        assert page.wait_done().startswith("done: stop")
    assert stream_ids[0] != stream_ids[1]


def test_the_grid_window_holds_every_block_in_use(open_page: OpenPage) -> None:
    """``chooseView``: the arc of block ids the grid shows, on owner lists made up here."""
    page = open_page()
    result = page.page.evaluate("""async () => {
      const { chooseView, MIN_VIEW } = await import("/js/pool-grid.js");
      const pool = (total, used) => {
        const owners = new Array(total).fill(null);
        for (const [id, owner] of used) owners[id] = owner;
        return owners;
      };
      const inView = (view, total, id) => (id - view.start + total) % total < view.size;
      const wrapped = pool(1024, [[1000, 1], [1010, 1], [1023, 2], [0, 2], [5, 1]]);
      const first = chooseView(wrapped, null);
      const moved = pool(1024, [[1010, 1], [1023, 2], [0, 2], [5, 1], [6, 1]]);
      const many = pool(1024, Array.from({length: 300}, (_, i) => [(i * 3) % 1024, i % 4]));
      return {
        minView: MIN_VIEW,
        first, firstHolds: [1000, 1010, 1023, 0, 5].every((id) => inView(first, 1024, id)),
        kept: chooseView(moved, first),
        empty: chooseView(pool(1024, []), null),
        small: chooseView(pool(100, [[7, 1]]), null),
        many: chooseView(many, null),
      };
    }""")
    first = result["first"]
    assert result["firstHolds"], first  # the arc wraps past block 1023
    assert result["minView"] <= first["size"] < 1024
    assert result["kept"] == first, "the window moved although every block still fits"
    assert result["empty"] == {"start": 0, "size": result["minView"]}
    assert result["small"] == {"start": 0, "size": 100}, "a small pool is shown whole"
    assert result["many"] == {"start": 0, "size": 1024}, "blocks all over the pool: show it all"
