"""StreamResources: the engine's model, caches and decoder, addressed by stream id.

One object owns everything a stream holds while it runs (a slot, K/V blocks, a conv-cache
slot, a pooled decoder state) so the engine can open, reset and close a stream in one call and
its step reads as policy, not bookkeeping.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from oasr.cache import (
    AttentionCacheManager,
    BlockPool,
    CacheConfig,
    CnnCacheManager,
    CtcStateCacheManager,
)
from oasr.decoding import Endpointer, GpuStreamingDecoder, Hypothesis
from oasr.engine.config import EngineConfig
from oasr.engine.model_runner import ModelRunner, StepOutput
from oasr.models import AsrModel, load_model

logger = logging.getLogger(__name__)


@dataclass
class StreamResources:
    """Model + cache managers + decoder of one engine.

    Invariant: a stream id is known to the attention manager, the conv cache and the CTC state
    pool at once, from `open_stream` to `close_stream`.
    """

    config: EngineConfig
    model: AsrModel
    cache_config: CacheConfig
    pool: BlockPool
    attention: AttentionCacheManager
    cnn: CnnCacheManager
    ctc: CtcStateCacheManager
    runner: ModelRunner
    endpointer: Endpointer | None

    @classmethod
    def build(cls, config: EngineConfig, model: AsrModel | None = None) -> StreamResources:
        """Load the model (unless given) and preallocate every pool for ``config``."""
        device = config.resolve_device()
        dtype = config.resolve_dtype(device)
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        if model is None:
            model = load_model(config.model)
        model = model.to(device=device, dtype=dtype).eval()
        cache_config = config.build_cache_config(model.config, device, dtype)
        pool = BlockPool(cache_config)
        attention = AttentionCacheManager(pool, cache_config)
        cnn = CnnCacheManager(cache_config)
        decoder = GpuStreamingDecoder(config.decoder, model.tokenizer, device=device)
        ctc = CtcStateCacheManager(decoder)
        runner = ModelRunner(model, attention, cnn, device, dtype)
        endpointer = Endpointer(config.endpoint) if config.endpoint is not None else None
        logger.info(
            "engine: %s on %s/%s, %d slots, %d blocks of %d frames (%.1f MiB K/V), "
            "per-stream ceiling %d frames",
            type(model.encoder).__name__, device, dtype, cache_config.max_batch_size,
            cache_config.max_num_blocks, cache_config.block_size_frames,
            pool.k_pool.nbytes * 2 / 2**20, cache_config.max_stream_frames,
        )
        return cls(config, model, cache_config, pool, attention, cnn, ctc, runner, endpointer)

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def num_free_slots(self) -> int:
        return self.attention.slot_pool.num_free_slots

    def open_stream(self, stream_id: int) -> int:
        """Bind the stream to a slot and give it zeroed caches and a fresh decoder state."""
        slot = self.attention.allocate_stream(stream_id)
        self.cnn.allocate_stream(stream_id, slot)
        self.ctc.allocate_stream(stream_id, batch=1, vocab_size=self.model.config.vocab_size)
        return slot

    def close_stream(self, stream_id: int) -> None:
        """Return the stream's blocks, slot, conv slot and decoder state to their pools."""
        self.ctc.free_stream(stream_id)
        self.cnn.free_stream(stream_id)
        self.attention.free_stream(stream_id)

    def reset_stream(self, stream_id: int) -> None:
        """An endpoint: start the stream's history over in place, keeping its slot."""
        self.attention.reset_stream(stream_id)
        self.cnn.reset_stream(stream_id)
        self.ctc.reset_stream(stream_id)

    def at_capacity(self, stream_id: int) -> bool:
        return self.attention.at_capacity(stream_id)

    # -- decoding ------------------------------------------------------------------------------
    def decode(self, stream_ids: list[int], output: StepOutput) -> list[ChunkResult]:
        """Decode the cohort's log-probs with one batched decoder call.

        Returns each stream's current best text and the endpoint rule that fired, if any.
        """
        decoder = self.ctc.decoder
        states = [self.ctc.get_state(s) for s in stream_ids]
        lengths = torch.tensor(output.lengths, dtype=torch.int64)  # host: no device sync
        decoder.decode_streams(output.log_probs.float(), states, lengths)
        texts = [h.text for h in decoder.partials(states)]
        if self.endpointer is None:
            return [ChunkResult(text, None) for text in texts]
        stats = decoder.frame_stats(states)
        return [ChunkResult(text, self.endpointer.detect(st))
                for text, st in zip(texts, stats, strict=True)]

    def final_hypothesis(self, stream_id: int) -> Hypothesis:
        """The best hypothesis of the stream's current segment."""
        return self.ctc.decoder.finalize_stream(self.ctc.get_state(stream_id))[0]


@dataclass(frozen=True)
class ChunkResult:
    """What decoding one chunk of one stream produced."""

    text: str
    endpoint_rule: str | None
