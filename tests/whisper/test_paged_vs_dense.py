"""Paged decoder K/V == dense decoder K/V on a tiny random Whisper: same logits, same greedy
tokens, rows at different lengths in one batch, pools back to full after every scenario."""

from __future__ import annotations

import pytest
import torch
from whisper_testutil import (
    TINY,
    TINY_SPEC,
    forced_logits,
    tiny_encoded,
    tiny_manager,
    tiny_model,
)

from oasr.cache.decoder_kv import PagedDecoderKv
from oasr.models.whisper import DecoderKv, greedy_decode


@pytest.mark.parametrize("reuse_cross", [True, False])
@torch.inference_mode()
def test_paged_greedy_tokens_and_logits_equal_dense(reuse_cross: bool) -> None:
    model = tiny_model()
    cross = model.decoder.cross_kv(tiny_encoded(3))
    dense_tokens = greedy_decode(model, TINY_SPEC, DecoderKv(cross, 16), 3, max_new_tokens=14)
    mgr = tiny_manager(max_num_blocks=40, block_size=4, max_rows=4)
    for row in range(3):
        mgr.allocate_row(row, 16)
    mgr.build_cross_kv([0, 1, 2], cross)
    view = mgr.view([0, 1, 2], reuse_cross=reuse_cross)
    paged_tokens = greedy_decode(model, TINY_SPEC, view, 3, max_new_tokens=14)
    assert paged_tokens == dense_tokens
    assert len({tuple(t) for t in dense_tokens}) > 1, "rows should decode differently"
    for row in range(3):
        mgr.free_row(row)
    assert mgr.pool.num_free_blocks == 40 and mgr.num_reserved_blocks == 0

    forced = torch.randint(0, 60, (3, 9), generator=torch.Generator().manual_seed(3))
    for row in range(3):
        mgr.allocate_row(row, 16)
    mgr.build_cross_kv([0, 1, 2], cross)
    paged = forced_logits(model, mgr.view([0, 1, 2], reuse_cross=reuse_cross), forced)
    dense = forced_logits(model, DecoderKv(cross, 16), forced)
    torch.testing.assert_close(paged, dense, rtol=1e-5, atol=1e-5)
    for row in range(3):
        mgr.free_row(row)
    assert mgr.pool.num_free_blocks == 40


@torch.inference_mode()
def test_rows_at_different_lengths_step_together() -> None:
    """Row A has decoded 6 tokens when row B joins; their joint steps equal each one alone."""
    model = tiny_model(seed=2)
    encoded = tiny_encoded(2, seed=5)
    cross_a = model.decoder.cross_kv(encoded[:1])
    cross_b = model.decoder.cross_kv(encoded[1:])
    forced = torch.randint(0, 60, (2, 10), generator=torch.Generator().manual_seed(4))
    alone_a = forced_logits(model, DecoderKv(cross_a, 16), forced[:1])  # (1, 11, V)
    alone_b = forced_logits(model, DecoderKv(cross_b, 16), forced[1:, :4])  # (1, 5, V)

    mgr = tiny_manager(max_num_blocks=40, block_size=4, max_rows=4)
    mgr.allocate_row(0, 16)
    mgr.build_cross_kv([0], cross_a)
    view_a = mgr.view([0])
    prompt = torch.tensor([TINY_SPEC.prompt])
    model.decoder(prompt, view_a)
    for i in range(6):
        model.decoder(forced[:1, i : i + 1], view_a)
    mgr.allocate_row(1, 16)
    mgr.build_cross_kv([1], cross_b)
    first_b = model.decoder(prompt, mgr.view([1]))[:, -1]
    torch.testing.assert_close(first_b, alone_b[:, 0], rtol=1e-5, atol=1e-5)
    joint = mgr.view([1, 0])  # order differs from slot order on purpose
    assert mgr.num_tokens(0) == 8 and mgr.num_tokens(1) == 2
    for i in range(4):
        step = torch.stack([forced[1, i], forced[0, 6 + i]]).unsqueeze(1)  # (2, 1)
        logits = model.decoder(step, joint)[:, -1]
        torch.testing.assert_close(logits[0], alone_b[0, i + 1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits[1], alone_a[0, 7 + i], rtol=1e-5, atol=1e-5)
    assert mgr.row_blocks(0) == ([5, 6, 13], [0, 1, 2, 3, 4])
    assert mgr.row_blocks(1) == ([12, 14], [7, 8, 9, 10, 11])
    mgr.free_row(0)
    mgr.free_row(1)
    assert mgr.pool.num_free_blocks == 40 and mgr.num_reserved_blocks == 0


@torch.inference_mode()
def test_select_reorders_like_dense_select() -> None:
    """After a reorder, paged rows step exactly like dense rows reordered the same way (the
    view's reused cross reads follow the new order)."""
    model = tiny_model(seed=6)
    cross = model.decoder.cross_kv(tiny_encoded(3, seed=8))
    prompt = torch.tensor(TINY_SPEC.prompt).expand(3, -1)
    dense = DecoderKv(cross, 8)
    mgr = tiny_manager(max_num_blocks=40, block_size=4)
    for row in range(3):
        mgr.allocate_row(row, 8)
    mgr.build_cross_kv([0, 1, 2], cross)
    paged = mgr.view([0, 1, 2])
    torch.testing.assert_close(model.decoder(prompt, paged), model.decoder(prompt, dense),
                               rtol=1e-5, atol=1e-5)
    paged.select([2, 0, 1])
    dense.select(torch.tensor([2, 0, 1]))
    step = torch.tensor([[3], [4], [5]])
    torch.testing.assert_close(model.decoder(step, paged), model.decoder(step, dense),
                               rtol=1e-5, atol=1e-5)
    assert [mgr.num_tokens(r) for r in (0, 1, 2)] == [3, 3, 3]


@torch.inference_mode()
def test_rows_leaving_keep_the_cross_reads_already_gathered() -> None:
    """A greedy batch whose rows leave one by one: the view keeps the kept rows' cross K/V it
    had gathered (selected, not read from the pages again), and steps as dense rows selected
    the same way do."""
    model = tiny_model(seed=7)
    cross = model.decoder.cross_kv(tiny_encoded(3, seed=9))
    prompt = torch.tensor(TINY_SPEC.prompt).expand(3, -1)
    mgr = tiny_manager(max_num_blocks=60, block_size=4)
    for row in range(3):
        mgr.allocate_row(row, 8)
    mgr.build_cross_kv([0, 1, 2], cross)
    paged = mgr.view([0, 1, 2])
    dense = DecoderKv(cross, 8)
    model.decoder(prompt, paged)
    model.decoder(prompt, dense)
    gathered = paged._cross_reads[0][0]  # (H, B, L, D)
    paged.select([2, 0])  # row 1 left
    kept = paged._cross_reads[0][0]
    assert kept.shape[1] == 2
    torch.testing.assert_close(kept, gathered[:, [2, 0], : kept.shape[2]])
    dense.select(torch.tensor([2, 0]))
    step = torch.tensor([[3], [5]])
    torch.testing.assert_close(model.decoder(step, paged), model.decoder(step, dense),
                               rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_rows_joining_keep_the_cross_reads_of_their_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of a running batch and rows just prefilled (each view having gathered its rows'
    cross K/V) join into one view that steps without reading the pages again, each row as
    it steps alone; rows of different encoded lengths, one leaving as the others join."""
    model = tiny_model(seed=11)
    encoded = tiny_encoded(3, seed=12)
    lengths = (20, 10, 14)
    crosses = [model.decoder.cross_kv(encoded[i : i + 1, :n]) for i, n in enumerate(lengths)]
    forced = torch.randint(0, 60, (3, 8), generator=torch.Generator().manual_seed(13))
    alone = [forced_logits(model, DecoderKv(crosses[i], 16), forced[i : i + 1])
             for i in range(3)]  # (1, 9, V) each: after the prompt, then after each step

    mgr = tiny_manager(max_num_blocks=60, block_size=4)
    for row in range(3):
        mgr.allocate_row(row, 16)
        mgr.build_cross_kv([row], crosses[row])
    prompt = torch.tensor(TINY_SPEC.prompt)
    running = mgr.view([0, 1])
    model.decoder(prompt.expand(2, -1), running)
    model.decoder(forced[:2, :1], running)  # rows 0 and 1 one token on
    fresh = mgr.view([2])
    model.decoder(prompt[None], fresh)  # row 2 prefilled: its view read its cross K/V

    def no_gather(*args: object, **kwargs: object) -> None:
        raise AssertionError("a joined view read pages it had gathered")

    joint = PagedDecoderKv.joined([running, fresh], [2, 1])  # row 0 left, row 2 joined
    assert set(joint._cross_reads) == set(range(TINY.n_text_layer))
    keys = joint._cross_reads[0][0]  # (H, 2, L, D): L covers the longer row's (row 2's) pages
    assert keys.shape[1:3] == (2, 16)
    torch.testing.assert_close(keys[:, 0, :14], fresh._cross_reads[0][0][:, 0, :14])
    torch.testing.assert_close(keys[:, 1, :10], running._cross_reads[0][0][:, 1, :10])
    assert not keys[:, 0, 14:].any() and not keys[:, 1, 10:].any()  # past a row's frames
    monkeypatch.setattr("oasr.cache.decoder_kv.gather_pages_head_major", no_gather)
    for i in range(3):
        step = torch.stack([forced[2, i], forced[1, 1 + i]]).unsqueeze(1)  # (2, 1)
        logits = model.decoder(step, joint)[:, -1]
        torch.testing.assert_close(logits[0], alone[2][0, 1 + i], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits[1], alone[1][0, 2 + i], rtol=1e-5, atol=1e-5)

    with pytest.raises(ValueError, match="in none of the views"):
        PagedDecoderKv.joined([running], [0, 2])
    with pytest.raises(ValueError, match="different decoder K/V managers"):
        PagedDecoderKv.joined([running, tiny_manager().view([])], [0])
    for row in range(3):
        mgr.free_row(row)
    assert mgr.pool.num_free_blocks == 60 and mgr.num_reserved_blocks == 0


def _windows(own: torch.Tensor, silence: torch.Tensor, frames: tuple[int, ...]) -> torch.Tensor:
    """(B, S, d) each row's own first ``frames[b]`` states, then the silent window's."""
    out = silence.expand(len(frames), -1, -1).clone()
    for b, n in enumerate(frames):
        out[b, :n] = own[b, :n]
    return out


@torch.inference_mode()
def test_rows_continued_by_a_shared_tail_step_as_their_whole_windows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows whose pages hold their windows' first frames only, continued by the manager's
    shared tail (the silent window's frames after them), step as dense rows over the whole
    windows: prefilled together (up to the longer one's own frames), one leaving, one joining
    from its own prefill; the pages hold those frames, not the window."""
    model = tiny_model(seed=15)
    frames = (7, 12, 4)  # own frames of 20
    silence = tiny_encoded(1, seed=16)
    windows = _windows(tiny_encoded(3, seed=17), silence, frames)
    forced = torch.randint(0, 60, (3, 6), generator=torch.Generator().manual_seed(18))
    alone = [forced_logits(model, DecoderKv(model.decoder.cross_kv(windows[b : b + 1]), 16),
                           forced[b : b + 1]) for b in range(3)]  # (1, 7, V) each

    mgr = tiny_manager(max_num_blocks=60, block_size=4)
    tail = [(k[0].transpose(0, 1), v[0].transpose(0, 1)) for k, v in model.decoder.cross_kv(silence)]
    mgr.set_shared_tail(tail)
    for row in range(3):
        mgr.allocate_row(row, 16)
    own = [(k[:2, :12], v[:2, :12]) for k, v in model.decoder.cross_kv(windows)]
    mgr.build_cross_kv([0, 1], own)  # row 0's frames 7-12 are the silent window's
    mgr.build_cross_kv([2], model.decoder.cross_kv(windows[2:, :4]))
    assert [len(mgr.row_blocks(r)[1]) for r in range(3)] == [3, 3, 1]  # not 5 pages each

    running = mgr.view([0, 1])
    prompt = torch.tensor(TINY_SPEC.prompt)
    first = model.decoder(prompt.expand(2, -1), running)[:, -1]
    torch.testing.assert_close(first, torch.cat([alone[0][:, 0], alone[1][:, 0]]),
                               rtol=1e-5, atol=1e-5)
    fresh = mgr.view([2])
    torch.testing.assert_close(model.decoder(prompt[None], fresh)[:, -1], alone[2][:, 0],
                               rtol=1e-5, atol=1e-5)
    logits = model.decoder(forced[:2, :1], running)[:, -1]  # rows 0 and 1 one token on
    torch.testing.assert_close(logits[1], alone[1][0, 1], rtol=1e-5, atol=1e-5)

    monkeypatch.setattr("oasr.cache.decoder_kv.gather_pages_head_major", _no_gather)
    joint = PagedDecoderKv.joined([running, fresh], [2, 1])  # row 0 left, row 2 joined
    for i in range(3):
        step = torch.stack([forced[2, i], forced[1, 1 + i]]).unsqueeze(1)  # (2, 1)
        logits = model.decoder(step, joint)[:, -1]
        torch.testing.assert_close(logits[0], alone[2][0, 1 + i], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits[1], alone[1][0, 2 + i], rtol=1e-5, atol=1e-5)
    joint.select([1])  # row 2 left: the kept row's reads are its own up to 12, then the tail
    logits = model.decoder(forced[1:2, 4:5], joint)[:, -1]
    torch.testing.assert_close(logits[0], alone[1][0, 5], rtol=1e-5, atol=1e-5)
    for row in range(3):
        mgr.free_row(row)
    assert mgr.pool.num_free_blocks == 60 and mgr.num_reserved_blocks == 0


@torch.inference_mode()
def test_a_row_holding_the_whole_window_beside_a_continued_one() -> None:
    """A row that holds every frame of the window (its last page running past it) and a row
    continued by the shared tail step together as their dense windows."""
    model = tiny_model(seed=19)
    frames = (20, 6)
    silence = tiny_encoded(1, seed=20)
    windows = _windows(tiny_encoded(2, seed=21), silence, frames)
    forced = torch.randint(0, 60, (2, 3), generator=torch.Generator().manual_seed(22))
    dense = forced_logits(model, DecoderKv(model.decoder.cross_kv(windows), 16), forced)
    mgr = tiny_manager(max_num_blocks=40, block_size=8)  # 3 pages are 24 frames of 20
    mgr.set_shared_tail([(k[0].transpose(0, 1), v[0].transpose(0, 1))
                         for k, v in model.decoder.cross_kv(silence)])
    for row in range(2):
        mgr.allocate_row(row, 16)
    cross = model.decoder.cross_kv(windows)
    mgr.build_cross_kv([0], [(k[:1], v[:1]) for k, v in cross])
    mgr.build_cross_kv([1], [(k[1:, :6], v[1:, :6]) for k, v in cross])
    paged = forced_logits(model, mgr.view([0, 1]), forced)
    torch.testing.assert_close(paged, dense, rtol=1e-5, atol=1e-5)


def _no_gather(*args: object, **kwargs: object) -> None:
    raise AssertionError("a view read pages it had gathered")


def test_a_shared_tail_must_span_the_cross_region() -> None:
    with pytest.raises(ValueError, match="a shared tail needs 2 layers of K, V each"):
        tiny_manager().set_shared_tail([(torch.zeros(2, 19, 16), torch.zeros(2, 19, 16))] * 2)


def test_the_shared_tail_after_a_frame_is_a_kept_contiguous_copy() -> None:
    mgr = tiny_manager()
    with pytest.raises(ValueError, match="needs a shared tail"):
        mgr.shared_tail_after(3)
    gen = torch.Generator().manual_seed(23)
    frames = mgr.cross_len
    tail = [(torch.randn(2, frames, 16, generator=gen), torch.randn(2, frames, 16, generator=gen))
            for _ in range(2)]
    mgr.set_shared_tail(tail)
    after = mgr.shared_tail_after(7)
    for (k, v), (k_after, v_after) in zip(tail, after, strict=True):
        assert k_after.is_contiguous() and v_after.is_contiguous()
        assert torch.equal(k_after, k[:, 7:]) and torch.equal(v_after, v[:, 7:])
    assert mgr.shared_tail_after(7) is after  # kept while the same frame is asked for
    assert torch.equal(mgr.shared_tail_after(9)[1][0], tail[1][0][:, 9:])
    mgr.set_shared_tail([(k + 1, v) for k, v in tail])  # a new tail drops the kept copy
    assert torch.equal(mgr.shared_tail_after(9)[0][0], tail[0][0][:, 9:] + 1)
