import contextlib
import sys
import threading

import pytest
import torch
from support.pool_views import fill_blocks, pool_k, pool_v

from oasr.cache import BlockPool


def test_tensor_shapes_include_scratch(make_config):
    cfg = make_config(max_num_blocks=8)
    pool = BlockPool(cfg, scratch_blocks=1)
    assert pool_k(pool).shape == pool_v(pool).shape == (2, 9, 4, 2, 4)
    assert pool.block_shape == (4, 2, 4) and pool.dtype == torch.float32
    assert pool.nbytes == 2 * 2 * 9 * 4 * 2 * 4 * 4  # K and V, float32
    assert pool.num_physical_blocks == 9
    assert pool.scratch_block_ids == (8,)
    assert pool.num_free_blocks == 8
    assert not pool_k(pool).any() and not pool_v(pool).any()


def test_storage_is_reached_only_through_the_two_views():
    assert not hasattr(BlockPool, "k_pool") and not hasattr(BlockPool, "v_pool")


class PerLayerPool(BlockPool):
    """K/V stored as one tensor per layer, reached only through the two view methods (the
    base class's tensors are dropped, so anything that reads them fails)."""

    def __init__(self, config, scratch_blocks=0):
        super().__init__(config, scratch_blocks)
        shape = (self.num_physical_blocks, *self.block_shape)
        self._layers = [(torch.zeros(shape, dtype=config.dtype), torch.zeros(shape, dtype=config.dtype))
                        for _ in range(config.num_layers)]
        self._k_pool = self._v_pool = None

    @property
    def nbytes(self):
        return sum(k.nbytes + v.nbytes for k, v in self._layers)

    def get_kv_view(self, layer):
        self._check_layer(layer)
        return self._layers[layer]

    def get_kv_block_view(self, layer, block_id):
        k, v = self.get_kv_view(layer)
        return k[block_id], v[block_id]

    def zero_blocks(self, block_ids):
        for k, v in self._layers:
            k[list(block_ids)] = 0.0
            v[list(block_ids)] = 0.0


def test_a_subclass_changes_the_storage_and_every_manager_follows(make_config):
    """Paged writes, dense commits and reads, the prefilled window's zeroing and the decoder
    K/V pool all go through the views, so a pool that stores K/V its own way serves them."""
    from oasr.cache import AttentionCacheManager
    from oasr.cache.decoder_kv import DecoderKVCacheManager
    from oasr.fmha import write_chunk_kv

    cfg = make_config(max_num_blocks=9, num_left_chunks=2, prefill_kv_window=True)
    results = []
    for cls in (BlockPool, PerLayerPool):
        torch.manual_seed(0)
        pool = cls(cfg)
        att = AttentionCacheManager(pool, cfg)
        att.allocate_stream(1)  # prefills 2 zeroed blocks
        att.prepare_chunk(1)
        k = torch.randn(1, 4, 2, 4)
        for cache in att.get_paged_caches(1):
            write_chunk_kv(cache, k, -k)
        att.commit_chunk_paged(1, 4)
        att.allocate_stream(2)
        att.commit(2, torch.randn(2, 2, 3, 8))  # dense mode: (L, H, T, 2D)
        results.append((att.get_stacked_cache(1), att.get_stacked_cache(2), pool.nbytes))
    (a1, a2, an), (b1, b2, bn) = results
    assert torch.equal(a1, b1) and torch.equal(a2, b2) and an == bn
    fp8 = make_config(max_num_blocks=8, dtype=torch.float8_e4m3fn)
    scales = [DecoderKVCacheManager(cls(fp8), cross_len=4, kv_cache="fp8_e4m3").k_scales.shape
              for cls in (BlockPool, PerLayerPool)]
    assert scales[0] == scales[1] == (2, 8, 4, 2)  # (layers, blocks, page, heads)


def test_allocate_is_fifo_and_freed_go_to_tail(make_config):
    pool = BlockPool(make_config(max_num_blocks=8))
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate(1) == [3]
    pool.free([1, 0])
    assert pool.num_free_blocks == 6
    assert pool.allocate(4) == [4, 5, 6, 7]
    assert pool.allocate(2) == [1, 0]
    assert pool.allocate(0) == []
    assert pool.num_free_blocks == 0


def test_exhausted_pool_raises_with_counts_and_takes_nothing(make_config):
    pool = BlockPool(make_config(max_num_blocks=8))
    pool.allocate(7)
    with pytest.raises(RuntimeError, match="requested 4 blocks, 1 free"):
        pool.allocate(4)
    assert pool.num_free_blocks == 1
    assert pool.allocate(1) == [7]


def test_negative_allocate_rejected(make_config):
    with pytest.raises(ValueError, match="-1"):
        BlockPool(make_config()).allocate(-1)


def test_scratch_block_never_handed_out(make_config):
    pool = BlockPool(make_config(max_num_blocks=8), scratch_blocks=2)
    assert sorted(pool.allocate(8)) == list(range(8))
    with pytest.raises(RuntimeError, match="requested 1 blocks, 0 free"):
        pool.allocate(1)


@pytest.mark.parametrize("bad", [8, 9])
def test_free_rejects_scratch(make_config, bad):
    pool = BlockPool(make_config(max_num_blocks=8), scratch_blocks=2)
    with pytest.raises(ValueError, match=f"block {bad} is a scratch block"):
        pool.free([bad])


def test_free_rejects_double_free(make_config):
    pool = BlockPool(make_config(max_num_blocks=8))
    ids = pool.allocate(2)
    pool.free([ids[0]])
    with pytest.raises(ValueError, match="double free of block 0"):
        pool.free([ids[0]])
    with pytest.raises(ValueError, match="double free of block 5"):
        pool.free([5])  # never allocated
    with pytest.raises(ValueError, match="double free of block 1"):
        pool.free([1, 1])
    assert pool.num_free_blocks == 7  # the rejected call freed nothing


@pytest.mark.parametrize("bad", [-1, 8, 100, "3", 1.0])
def test_free_rejects_unknown_ids(make_config, bad):
    pool = BlockPool(make_config(max_num_blocks=8))
    pool.allocate(8)
    with pytest.raises(ValueError):
        pool.free([bad])
    assert pool.num_free_blocks == 0


def test_free_is_all_or_nothing(make_config):
    pool = BlockPool(make_config(max_num_blocks=8))
    pool.allocate(3)
    with pytest.raises(ValueError, match="unknown block id 42"):
        pool.free([0, 1, 42])
    assert pool.num_free_blocks == 5


def test_views_alias_the_pool(make_config):
    pool = BlockPool(make_config(max_num_blocks=8), scratch_blocks=1)
    k, v = pool.get_kv_view(1)
    assert k.shape == v.shape == (9, 4, 2, 4)
    kb, vb = pool.get_kv_block_view(1, 3)
    assert kb.shape == (4, 2, 4)
    kb.fill_(2.0)
    vb.fill_(3.0)
    assert torch.all(pool_k(pool)[1, 3] == 2.0) and torch.all(k[3] == 2.0)
    assert torch.all(pool_v(pool)[1, 3] == 3.0)
    assert not pool_k(pool)[0].any() and not pool_k(pool)[1, 2].any()
    pool.get_kv_block_view(0, 8)  # the scratch block is addressable
    with pytest.raises(ValueError, match="layer 2"):
        pool.get_kv_view(2)
    with pytest.raises(ValueError, match="block id 9"):
        pool.get_kv_block_view(0, 9)


def test_zero_blocks(make_config):
    pool = BlockPool(make_config(max_num_blocks=8))
    fill_blocks(pool, 1.0)
    pool.zero_blocks([2, 5])
    assert not pool_k(pool)[:, [2, 5]].any() and not pool_v(pool)[:, [2, 5]].any()
    assert pool_k(pool)[:, [0, 1, 3, 4, 6, 7]].all()


def test_rejects_bad_scratch_count(make_config):
    with pytest.raises(ValueError, match="scratch_blocks"):
        BlockPool(make_config(), scratch_blocks=-1)


def test_threads_hammering_allocate_free_lose_nothing(make_config):
    pool = BlockPool(make_config(max_num_blocks=16), scratch_blocks=1)
    held: list[list[int]] = [[] for _ in range(6)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def worker(i: int) -> None:
        try:
            barrier.wait()
            for step in range(400):
                n = 1 + (step + i) % 3
                with contextlib.suppress(RuntimeError):  # pool momentarily empty
                    held[i].extend(pool.allocate(n))
                if len(held[i]) > 2:
                    pool.free(held[i][:2])
                    del held[i][:2]
        except BaseException as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible to expose races
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    outstanding = [b for h in held for b in h]
    assert len(outstanding) == len(set(outstanding))  # no id handed out twice
    assert pool.num_free_blocks + len(outstanding) == 16  # no id lost
    for h in held:
        pool.free(h)
    assert sorted(pool.allocate(16)) == list(range(16))
