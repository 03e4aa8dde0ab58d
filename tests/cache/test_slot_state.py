"""StreamStateSpec and SlotStateCache: declared fixed-extent state, slot-addressed."""

import pytest
import torch

from oasr.cache import SlotStateCache, StreamStateSpec


def specs():
    return [
        StreamStateSpec("tail", (2, 3), slot_axis=0),
        StreamStateSpec("conv", (4, 2, 5), slot_axis=1),
        StreamStateSpec("prompt", (1,), slot_axis=0, persistent=True, dtype=torch.int64),
    ]


def test_spec_validation():
    spec = StreamStateSpec("conv", [4, 2, 5], slot_axis=1)
    assert spec.shape == (4, 2, 5) and spec.stored_shape(7) == (4, 7, 2, 5)
    assert StreamStateSpec("x", (2,), slot_axis=1).stored_shape(3) == (2, 3)
    with pytest.raises(ValueError, match="slot_axis 4 out of range 0..3"):
        StreamStateSpec("bad", (1, 2, 3), slot_axis=4)
    with pytest.raises(ValueError, match="shape"):
        StreamStateSpec("bad", (0, 2))
    with pytest.raises(ValueError, match="non-empty"):
        StreamStateSpec("", (1,))
    with pytest.raises(ValueError, match="repeat"):
        SlotStateCache([spec, spec], 2, "cpu", torch.float32)


def test_buffers_allocated_once_with_pad_lanes():
    cache = SlotStateCache(specs(), 3, "cpu", torch.float32, pad_lanes=1)
    assert cache.buffers["tail"].shape == (4, 2, 3)
    assert cache.buffers["conv"].shape == (4, 4, 2, 5)
    assert cache.buffers["prompt"].dtype == torch.int64
    assert cache.pad_lane_slots == (3,)


def test_allocation_zeroes_the_slot_and_gather_scatter_round_trip():
    cache = SlotStateCache(specs(), 3, "cpu", torch.float32, pad_lanes=1)
    for buf in cache.buffers.values():
        buf.fill_(7)
    assert cache.allocate_stream(10) == 0
    assert cache.allocate_stream(11) == 1
    assert not cache.buffers["conv"][:, 0].any() and not cache.buffers["conv"][:, 1].any()
    assert torch.all(cache.buffers["conv"][:, 2] == 7)  # a free slot is untouched
    views = cache.views([11, 10])
    conv = views["conv"].gather()
    assert conv.shape == (4, 2, 2, 5) and not conv.any()
    new = torch.arange(80, dtype=torch.float32).reshape(4, 2, 2, 5)
    ptr = cache.buffers["conv"].data_ptr()
    views["conv"].scatter(new)
    assert cache.buffers["conv"].data_ptr() == ptr
    assert torch.equal(cache.buffers["conv"][:, 1], new[:, 0])  # stream 11 -> slot 1
    assert torch.equal(cache.buffers["conv"][:, 0], new[:, 1])
    assert torch.equal(cache.slot_view(11, "conv"), new[:, :1])
    with pytest.raises(ValueError, match=r"scatter got shape \(4, 1, 2, 5\), expected \(4, 2, 2, 5\)"):
        views["conv"].scatter(new[:, :1])


def test_padded_views_touch_only_the_pad_lane():
    cache = SlotStateCache(specs(), 3, "cpu", torch.float32, pad_lanes=1)
    cache.allocate_stream(1)
    view = cache.views([1], pad_to=3)["tail"]
    assert view.slots.tolist() == [0, 3, 3]
    view.scatter(torch.ones(3, 2, 3))
    assert torch.all(cache.buffers["tail"][0] == 1) and torch.all(cache.buffers["tail"][3] == 1)
    assert not cache.buffers["tail"][1:3].any()
    with pytest.raises(ValueError, match="no pad lanes"):
        SlotStateCache(specs(), 3, "cpu", torch.float32).views([], pad_to=2)


def test_reset_keeps_persistent_and_fill_slot():
    cache = SlotStateCache(specs(), 3, "cpu", torch.float32)
    cache.allocate_stream(5)
    cache.fill_slot(5, "prompt", 3)
    cache.fill_slot(5, "tail", 1.5)
    assert cache.buffers["prompt"][0].item() == 3
    cache.reset_stream(5)
    assert cache.buffers["prompt"][0].item() == 3  # describes the request: kept
    assert not cache.buffers["tail"][0].any()
    cache.free_stream(5)
    cache.allocate_stream(6)  # same slot, zeroed on allocation, persistent included
    assert cache.slot_of(6) == 0 and cache.buffers["prompt"][0].item() == 0
    with pytest.raises(KeyError, match="no state named 'nope'"):
        cache.fill_slot(6, "nope", 1.0)


def test_stream_errors_and_caller_slots():
    cache = SlotStateCache(specs(), 2, "cpu", torch.float32)
    cache.allocate_stream(1)
    with pytest.raises(ValueError, match="stream 1 is already allocated"):
        cache.allocate_stream(1)
    with pytest.raises(ValueError, match="slot 0 is already bound to stream 1"):
        cache.allocate_stream(2, slot=0)
    with pytest.raises(ValueError, match="slot 2 out of range"):
        cache.allocate_stream(2, slot=2)
    assert cache.allocate_stream(2, slot=1) == 1
    cache.free_stream(2)
    assert cache.allocate_stream(3) == 1  # unbound by the free: the lowest unbound slot again
    cache.free_stream(3)
    for call in (cache.free_stream, cache.reset_stream, cache.slot_of, lambda s: cache.views([s])):
        with pytest.raises(KeyError, match="stream 9 is not allocated"):
            call(9)
    cache.free_stream(1)
    assert cache.stream_ids == [] and cache.allocate_stream(4) == 0


def test_staged_views_write_nothing_until_their_rows_are_written():
    """The engine's step scatters into staged views; only the rows whose chunk succeeded are
    written afterwards (`write_rows`), any of the batch's rows into any slots."""
    cache = SlotStateCache(specs()[:2], 3, "cpu", torch.float32, pad_lanes=1)
    for sid in (10, 11, 12):
        cache.allocate_stream(sid)
    before = {n: b.clone() for n, b in cache.buffers.items()}
    staged: dict[str, torch.Tensor] = {}
    views = cache.views_for_slots(torch.tensor([0, 1, 2, 3]), staged)  # 3 streams + pad lane
    new_tail = torch.arange(4 * 6, dtype=torch.float32).view(4, 2, 3) + 1
    new_conv = torch.ones(4, 4, 2, 5)
    views["tail"].scatter(new_tail)
    views["conv"].scatter(new_conv)
    assert all(torch.equal(cache.buffers[n], before[n]) for n in before)  # nothing written
    assert set(staged) == {"tail", "conv"}
    with pytest.raises(ValueError, match="expected"):
        views["tail"].scatter(new_tail[:2])
    cache.write_rows(torch.tensor([2, 0]), staged, rows=torch.tensor([2, 0]))  # rows 0 and 2 only
    assert torch.equal(cache.buffers["tail"][[0, 2]], new_tail[[0, 2]])
    assert torch.equal(cache.buffers["tail"][[1, 3]], before["tail"][[1, 3]])
    assert torch.equal(cache.buffers["conv"][:, [0, 2]], new_conv[:, [0, 2]])
    assert not cache.buffers["conv"][:, 1].any()
    cache.write_rows(torch.tensor([1]), {"tail": new_tail[1:2]})  # rows 0..N-1 by default
    assert torch.equal(cache.buffers["tail"][1], new_tail[1])
