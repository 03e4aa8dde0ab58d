"""StreamResources owns the slots: one slot per stream, passed to every manager alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oasr.engine import EngineConfig
from oasr.engine.runner.streams import StreamResources


@pytest.fixture()
def resources(engine_config: EngineConfig) -> StreamResources:
    return StreamResources.build(replace(engine_config, max_batch_size=3))


def slots_of(res: StreamResources, stream_id: int) -> tuple[int, int, int]:
    """The stream's row in the block table, the conv cache and the decoder's storage."""
    assert res.attention is not None
    return (res.attention.slot_of(stream_id), res.states.slot_of(stream_id),
            res.ctc.get_state(stream_id).pool_row)


def test_one_slot_from_the_resources_pool_addresses_every_manager(resources) -> None:
    assert [resources.open_stream(s) for s in (7, 8, 9)] == [0, 1, 2]
    assert [slots_of(resources, s) for s in (7, 8, 9)] == [(0, 0, 0), (1, 1, 1), (2, 2, 2)]
    assert resources.num_free_slots == 0
    with pytest.raises(RuntimeError, match="all 3 slots are in use"):
        resources.open_stream(10)
    resources.close_stream(8)
    assert resources.num_free_slots == 1 and 8 not in resources.states
    assert resources.open_stream(11) == 1  # the freed slot, in every manager
    assert slots_of(resources, 11) == (1, 1, 1)
    for sid in (7, 9, 11):
        resources.close_stream(sid)
    assert resources.num_free_slots == 3 and resources.ctc.stream_ids == []


def test_a_failed_open_keeps_nothing(resources) -> None:
    resources.open_stream(1)
    with pytest.raises(ValueError, match="stream 1 is already allocated"):
        resources.open_stream(1)
    assert resources.num_free_slots == 2 and slots_of(resources, 1) == (0, 0, 0)
    resources.ctc.decoder.create_state(1, resources.family.vocab_size, row=1)  # row 1 taken
    with pytest.raises(ValueError, match="decoder row 1 is already held"):
        resources.open_stream(2)  # rolled back: no slot, no blocks, no state rows kept
    assert resources.num_free_slots == 2 and 2 not in resources.states
    assert resources.attention is not None and 2 not in resources.attention
    assert resources.attention.stream_ids == [1]
