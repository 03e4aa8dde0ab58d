"""StreamSlotPool (the engine's one slot owner) and SlotBindings (a manager's slot map)."""

import pytest

from oasr.cache import StreamSlotPool
from oasr.cache.slots import SlotBindings, padded_slot_list


def test_slot_pool_lowest_first_and_errors():
    pool = StreamSlotPool(3)
    assert [pool.allocate() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="all 3 slots are in use"):
        pool.allocate()
    pool.free(2)
    pool.free(0)
    assert pool.num_free_slots == 2 and pool.is_free(0) and not pool.is_free(1)
    assert pool.allocate() == 0
    with pytest.raises(ValueError, match="double free of stream slot 2"):
        pool.free(2)
    with pytest.raises(ValueError, match="slot 3 out of range"):
        pool.free(3)
    with pytest.raises(ValueError, match="num_slots"):
        StreamSlotPool(0)


def test_bindings_take_the_callers_slot_or_the_lowest_unbound_one():
    bindings = SlotBindings(3)
    assert bindings.bind(7, 2) == 2 and bindings.bind(8) == 0 and bindings.bind(9) == 1
    assert bindings.stream_ids == [7, 8, 9] and bindings.slot_of(7) == 2 and 8 in bindings
    with pytest.raises(RuntimeError, match="all 3 slots are in use"):
        bindings.bind(10)
    with pytest.raises(ValueError, match="stream 7 is already allocated \\(slot 2\\)"):
        bindings.bind(7)
    assert bindings.unbind(8) == 0 and 8 not in bindings
    with pytest.raises(ValueError, match="slot 1 is already bound to stream 9"):
        bindings.bind(10, 1)
    with pytest.raises(ValueError, match="slot 3 out of range: streams use 0..2"):
        bindings.bind(10, 3)
    assert bindings.bind(10) == 0
    with pytest.raises(KeyError):
        bindings.unbind(8)


def test_padded_slot_list_cycles_the_pad_lanes():
    assert padded_slot_list([2, 0], None, (3,)) == [2, 0]
    assert padded_slot_list([2, 0], 5, (3, 4)) == [2, 0, 3, 4, 3]
    with pytest.raises(ValueError, match="no pad lanes"):
        padded_slot_list([1], 2, ())
