import pytest
import torch

from oasr.cache import CnnCacheManager


@pytest.fixture
def cnn(make_config):
    return CnnCacheManager(make_config(), pad_lanes=1)  # L=2, k-1=2, D=6, 3 slots + 1 lane


def test_buffer_layout(cnn):
    assert cnn.buffer.shape == (2, 4, 2, 6)
    assert cnn.buffer.dtype == torch.float32
    assert cnn.stream_shape == (2, 1, 2, 6)


def test_allocate_zeroes_and_get_cache_is_a_view(cnn):
    cnn.buffer.fill_(3.0)
    assert cnn.allocate_stream(7) == 0
    cache = cnn.get_cache(7)
    assert cache.shape == (2, 1, 2, 6) and not cache.any()
    assert torch.all(cnn.buffer[:, 1:] == 3.0)
    cache.fill_(1.0)
    assert torch.all(cnn.buffer[:, 0] == 1.0)


def test_update_in_place_and_shape_error(cnn):
    cnn.allocate_stream(7)
    cnn.allocate_stream(8)
    ptr = cnn.buffer.data_ptr()
    new = torch.randn(2, 1, 2, 6)
    cnn.update(8, new)
    assert cnn.buffer.data_ptr() == ptr
    assert torch.equal(cnn.buffer[:, 1:2], new) and not cnn.buffer[:, 0].any()
    with pytest.raises(ValueError, match=r"got shape \(2, 1, 6, 2\), expected \(2, 1, 2, 6\)"):
        cnn.update(8, new.transpose(2, 3))


def test_wenet_layout_round_trip(cnn):
    cnn.allocate_stream(1)
    wenet = torch.randn(2, 1, 6, 2)  # (L, 1, D, k-1)
    cnn.update_wenet(1, wenet)
    assert torch.equal(cnn.get_wenet_cache(1), wenet)
    assert torch.equal(cnn.get_cache(1), wenet.transpose(2, 3))


def test_batched_gather_scatter_with_padding(cnn):
    for sid in (1, 2, 3):
        cnn.allocate_stream(sid)
    new = torch.randn(2, 4, 2, 6)
    cnn.scatter([3, 1], new, pad_to=4)
    assert torch.equal(cnn.buffer[:, 2], new[:, 0]) and torch.equal(cnn.buffer[:, 0], new[:, 1])
    assert torch.equal(cnn.buffer[:, 3], new[:, 3])  # the pad lane took the padding rows
    assert not cnn.buffer[:, 1].any()
    assert torch.equal(cnn.gather([1, 3]), torch.stack([new[:, 1], new[:, 0]], dim=1))
    with pytest.raises(ValueError, match="expected"):
        cnn.scatter([1], new)


def test_reset_zeroes_and_free_releases(cnn):
    cnn.allocate_stream(1)
    cnn.update(1, torch.ones(2, 1, 2, 6))
    cnn.reset_stream(1)
    assert not cnn.get_cache(1).any() and cnn.slot_of(1) == 0
    cnn.free_stream(1)
    assert cnn.stream_ids == [] and cnn.allocate_stream(2) == 0


def test_errors(cnn):
    cnn.allocate_stream(1)
    with pytest.raises(ValueError, match="stream 1 is already allocated"):
        cnn.allocate_stream(1)
    for call in (lambda: cnn.get_cache(2), lambda: cnn.update(2, torch.zeros(2, 1, 2, 6)),
                 lambda: cnn.free_stream(2), lambda: cnn.gather([2])):
        with pytest.raises(KeyError, match="stream 2 is not allocated"):
            call()
