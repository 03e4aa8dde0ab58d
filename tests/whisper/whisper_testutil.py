"""A tiny random Whisper and decoder pools for fast CPU tests."""

from __future__ import annotations

import torch

from oasr.cache import BlockPool, CacheConfig
from oasr.cache.decoder_kv import DecoderKVCacheManager
from oasr.fmha.fp8 import FP8_DTYPE
from oasr.models.whisper import DecodingSpec, WhisperConfig, WhisperModel
from oasr.models.whisper.model import DecoderKvStore

TINY = WhisperConfig(n_mels=8, n_audio_ctx=20, n_audio_state=32, n_audio_head=2, n_audio_layer=1,
                     n_vocab=64, n_text_ctx=32, n_text_state=32, n_text_head=2, n_text_layer=2)
TINY_SPEC = DecodingSpec(prompt=(61, 62), eot=60, suppress_ids=(63,), suppress_ids_begin=(60,))


def tiny_model(seed: int = 0) -> WhisperModel:
    """Random weights (larger than default init so greedy paths vary), eval mode, CPU."""
    torch.manual_seed(seed)
    model = WhisperModel(TINY)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3)
        model.decoder.positions.normal_(0.0, 0.3)
        model.encoder.positions.normal_(0.0, 0.3)
    return model.eval()


def tiny_encoded(batch: int, seed: int = 1) -> torch.Tensor:
    """(B, 20, 32) random encoder states."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, TINY.n_audio_ctx, TINY.n_audio_state, generator=gen)


def tiny_manager(max_num_blocks: int = 16, block_size: int = 4, max_rows: int = 4,
                 max_blocks_per_seq: int = 8, fp8: bool = False,
                 cross_len: int = TINY.n_audio_ctx) -> DecoderKVCacheManager:
    """A decoder pool for TINY: 2 layers, 2 kv heads of 16 dims."""
    config = CacheConfig(
        num_layers=TINY.n_text_layer, n_kv_head=TINY.n_text_head, head_dim=TINY.text_head_dim,
        hidden_dim=TINY.n_text_state, kernel_size=1, chunk_size=block_size,
        block_size_frames=block_size, max_num_blocks=max_num_blocks,
        max_blocks_per_seq=max_blocks_per_seq, max_batch_size=max_rows, device="cpu",
        dtype=FP8_DTYPE if fp8 else torch.float32,
    )
    return DecoderKVCacheManager(BlockPool(config), cross_len, "fp8_e4m3" if fp8 else None)


def forced_logits(model: WhisperModel, kv: DecoderKvStore, steps: torch.Tensor) -> torch.Tensor:
    """Prompt, then teacher-forced ``steps`` (B, N): logits (B, N + 1, V) of each position."""
    batch = steps.size(0)
    prompt = torch.tensor(TINY_SPEC.prompt).expand(batch, -1)
    out = [model.decoder(prompt, kv)[:, -1]]
    for i in range(steps.size(1)):
        out.append(model.decoder(steps[:, i : i + 1], kv)[:, -1])
    return torch.stack(out, dim=1)
