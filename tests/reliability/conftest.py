"""Reliability fixtures: real ``oasr-server`` processes with the random model, clips, references.

Every server started here must leave no traceback in its log: a crash inside a handler is a
failure even when the clients saw a clean close.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ws_clients import (
    BLOCKS_PER_STREAM,
    Clip,
    assert_server_clean,
    make_clips,
    reference_finals,
)

NUM_CLIPS = 32
CLIP_S = 3.0

@pytest.fixture
def checked_server(start_server: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """``start_server`` whose servers must end the test healthy, idle and traceback-free."""
    started: list[Any] = []

    def start(model_dir: Path, *flags: str) -> Any:
        server = start_server(model_dir, *flags)
        started.append(server)
        return server

    yield start
    for server in started:
        assert_server_clean(server)


@pytest.fixture(scope="module")
def clips(devset_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Clip]:
    """NUM_CLIPS distinct 3 s clips of real speech."""
    return make_clips(devset_dir, NUM_CLIPS, CLIP_S, tmp_path_factory.mktemp("clips"))


@pytest.fixture(scope="module")
def references(random_model_dir: Path, clips: list[Clip]) -> list[list[str]]:
    """Each clip's segments from the random model offline (non-empty: comparisons bite)."""
    finals = reference_finals(random_model_dir, clips, BLOCKS_PER_STREAM)
    assert all(any(text for text in f) for f in finals), f"an empty reference: {finals}"
    assert len({tuple(f) for f in finals}) == len(finals), "two clips share a transcript"
    return finals
