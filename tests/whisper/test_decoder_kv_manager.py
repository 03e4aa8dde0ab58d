"""DecoderKVCacheManager bookkeeping on tiny pools: exact block ids, reservations, refusals."""

from __future__ import annotations

import pytest
import torch
from whisper_testutil import TINY, tiny_manager

from oasr.cache import BlockPool, CacheConfig
from oasr.cache.decoder_kv import DecoderKVCacheManager, resolve_kv_storage


def test_prepare_allocates_a_page_only_when_a_row_crosses_a_boundary() -> None:
    mgr = tiny_manager(max_num_blocks=16, block_size=4, cross_len=0)
    mgr.allocate_row(7, max_tokens=10)
    assert mgr.pool.num_free_blocks == 16 and mgr.num_reserved_blocks == 3
    mgr.prepare([7], 2)
    mgr.commit([7], 2)
    assert mgr.row_blocks(7) == ([0], [])
    for _ in range(2):  # tokens 2, 3: still page 0
        mgr.prepare([7], 1)
        mgr.commit([7], 1)
    assert mgr.row_blocks(7) == ([0], [])
    mgr.prepare([7], 1)  # token 4 crosses into the second page
    assert mgr.row_blocks(7) == ([0, 1], [])
    assert mgr.self_table.host[0, :3].tolist() == [0, 1, 0]
    assert mgr.num_reserved_blocks == 1 and mgr.pool.num_free_blocks == 14


def test_truncate_keeps_the_rows_pages_and_writes_on_from_the_kept_length() -> None:
    # a draft fed with the prompt and taken in part: the rest is written over later
    mgr = tiny_manager(max_num_blocks=16, block_size=4, cross_len=0)
    slot = mgr.allocate_row(7, max_tokens=10)
    mgr.prepare([7], 9)
    mgr.commit([7], 9)
    assert mgr.row_blocks(7) == ([0, 1, 2], []) and mgr.num_reserved_blocks == 0
    mgr.truncate(7, 5)
    assert mgr.num_tokens(7) == 5 and mgr.self_lens.host[slot] == 5
    mgr.prepare([7], 5)  # up to the ceiling again: no page taken, none needed
    mgr.commit([7], 5)
    assert mgr.row_blocks(7) == ([0, 1, 2], []) and mgr.num_tokens(7) == 10
    with pytest.raises(ValueError, match="cannot truncate"):
        mgr.truncate(7, 11)
    with pytest.raises(ValueError, match="cannot truncate"):
        mgr.truncate(7, -1)
    mgr.free_row(7)
    assert mgr.pool.num_free_blocks == 16


def test_two_rows_interleave_pages_and_free_returns_every_page() -> None:
    mgr = tiny_manager(max_num_blocks=16, block_size=4, cross_len=0)
    assert mgr.allocate_row(1, 8) == 0
    assert mgr.allocate_row(2, 8) == 1
    mgr.prepare([1, 2], 3)
    mgr.commit([1, 2], 3)
    mgr.prepare([1, 2], 2)
    assert mgr.row_blocks(1) == ([0, 2], []) and mgr.row_blocks(2) == ([1, 3], [])
    mgr.free_row(1)
    assert mgr.pool.num_free_blocks == 14 and mgr.num_reserved_blocks == 0
    assert mgr.self_table.host[0].tolist() == [0] * 8
    mgr.free_row(2)
    assert mgr.pool.num_free_blocks == 16 and mgr.num_rows == 0
    assert mgr.allocate_row(3, 4) == 0  # lowest free slot again
    mgr.prepare([3], 1)
    assert mgr.row_blocks(3) == ([4], [])  # FIFO free list: freed pages are reused last


def test_can_admit_reserves_each_rows_ceiling_and_says_why() -> None:
    mgr = tiny_manager(max_num_blocks=16, block_size=4)  # cross_len 20: 5 pages per row
    assert mgr.blocks_for(12) == 3 + 5
    mgr.allocate_row(0, 12)  # reserves 8, takes nothing yet
    assert mgr.pool.num_free_blocks == 16
    decision = mgr.can_admit([12, 1])
    assert not decision.ok
    assert decision.reason == "2 rows need 14 blocks, 8 unreserved of 16"
    assert mgr.can_admit([12]).ok
    with pytest.raises(RuntimeError, match="1 rows need 11 blocks, 8 unreserved of 16"):
        mgr.allocate_row(1, 24)  # 6 + 5 pages
    assert not mgr.can_admit([33]).ok and "outside 1..32" in mgr.can_admit([33]).reason


def test_can_admit_refuses_more_rows_than_slots() -> None:
    mgr = tiny_manager(max_num_blocks=64, max_rows=2)
    mgr.allocate_row(0, 4)
    decision = mgr.can_admit([4, 4])
    assert not decision.ok and decision.reason == "2 rows asked, 1 row slots free"


def test_build_cross_kv_is_a_fixed_region_that_reads_back() -> None:
    mgr = tiny_manager(max_num_blocks=16, block_size=4)
    mgr.allocate_row(5, 4)
    k = torch.randn(1, 20, 2, 16)
    v = torch.randn(1, 20, 2, 16)
    mgr.build_cross_kv([5], [(k, v), (k * 2, v * 2)])
    assert mgr.row_blocks(5) == ([], [0, 1, 2, 3, 4])
    assert mgr.num_reserved_blocks == 1
    k_pool, v_pool = mgr.pool.get_kv_view(1)
    torch.testing.assert_close(k_pool[[0, 1, 2, 3, 4]].reshape(1, 20, 2, 16), k * 2)
    torch.testing.assert_close(v_pool[[0, 1, 2, 3, 4]].reshape(1, 20, 2, 16), v * 2)
    with pytest.raises(ValueError, match="cross K/V has 2 rows for 1 decoder rows"):
        mgr.build_cross_kv([5], [(k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1))] * 2)
    with pytest.raises(ValueError, match="already has its cross K/V"):
        mgr.build_cross_kv([5], [(k, v), (k, v)])
    mgr.free_row(5)
    assert mgr.pool.num_free_blocks == 16 and mgr.num_reserved_blocks == 0


def test_row_lifecycle_errors() -> None:
    mgr = tiny_manager()
    mgr.allocate_row(1, 4)
    with pytest.raises(ValueError, match="already allocated"):
        mgr.allocate_row(1, 4)
    mgr.prepare([1], 4)
    mgr.commit([1], 4)
    with pytest.raises(ValueError, match="4 tokens \\+ 1 new > its declared ceiling 4"):
        mgr.prepare([1], 1)
    mgr.free_row(1)
    with pytest.raises(KeyError, match="unknown decoder row 1"):
        mgr.free_row(1)
    with pytest.raises(KeyError, match="unknown decoder row 9"):
        mgr.prepare([9], 1)


def test_select_reorders_but_refuses_to_alias_rows() -> None:
    mgr = tiny_manager(max_num_blocks=32)
    for row in (10, 11, 12):
        mgr.allocate_row(row, 8)
    mgr.prepare([10, 11, 12], 1)
    view = mgr.view([10, 11, 12])
    with pytest.raises(ValueError, match="repeats a row"):
        view.select([0, 0, 2])
    with pytest.raises(ValueError, match="repeat a row"):
        mgr.view([10, 10])
    view.select([2, 0])
    assert view.row_ids == [12, 10]
    assert view.self_table[:, 0].tolist() == [mgr.row_blocks(12)[0][0], mgr.row_blocks(10)[0][0]]


def test_merge_joins_views_and_refuses_shared_rows() -> None:
    mgr = tiny_manager(max_num_blocks=32)
    for row in (1, 2, 3):
        mgr.allocate_row(row, 8)
    mgr.prepare([1, 2, 3], 1)
    mgr.commit([1, 2, 3], 1)
    merged = mgr.view([3]).merge(mgr.view([1, 2]))
    assert merged.row_ids == [3, 1, 2] and merged.batch_size == 3
    assert merged.self_table[:, 0].tolist() == [mgr.row_blocks(r)[0][0] for r in (3, 1, 2)]
    with pytest.raises(ValueError, match="repeat a row"):
        mgr.view([1]).merge(mgr.view([1, 2]))
    with pytest.raises(ValueError, match="different decoder K/V managers"):
        mgr.view([1]).merge(tiny_manager().view([]))


def test_pool_format_must_match_kv_cache() -> None:
    config = CacheConfig(num_layers=1, n_kv_head=1, head_dim=4, hidden_dim=4, kernel_size=1,
                         chunk_size=4, block_size_frames=4, max_num_blocks=4,
                         max_blocks_per_seq=4, max_batch_size=1, device="cpu",
                         dtype=torch.float32)
    with pytest.raises(ValueError, match="must agree"):
        DecoderKVCacheManager(BlockPool(config), 0, "fp8_e4m3")
    with pytest.raises(ValueError, match="unknown decoder kv_cache format 'int4'"):
        DecoderKVCacheManager(BlockPool(config), 0, "int4")


def test_resolve_kv_storage() -> None:
    assert resolve_kv_storage("auto", 1) == "paged"
    assert resolve_kv_storage("auto", 4) == "dense"
    assert resolve_kv_storage("dense", 1) == "dense"
    with pytest.raises(ValueError, match="cannot run beam search"):
        resolve_kv_storage("paged", 4)
    with pytest.raises(ValueError, match="kv_storage must be one of"):
        resolve_kv_storage("flat", 1)
    assert TINY.text_head_dim == 16
