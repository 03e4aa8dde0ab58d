"""Pooled per-stream CTC decoder state around one shared streaming decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder, Hypothesis, Tokenizer


class StreamingDecoder(Protocol):
    """The decoder interface a ``StreamHandle`` forwards to (``GpuStreamingDecoder`` has it).

    ``CtcStateCacheManager`` is built on ``GpuStreamingDecoder`` itself (it also batches with
    ``decode_streams``); another decoder with this interface can be wrapped in handles too.
    """

    @property
    def config(self) -> Any: ...

    def create_state(self, batch: int, vocab_size: int) -> Any: ...

    def reset_state(self, state: Any, batch: int, vocab_size: int) -> None: ...

    def decode_chunk(
        self, log_probs: torch.Tensor, state: Any, lengths: torch.Tensor | None = None
    ) -> None: ...

    def partial(self, state: Any, row: int = 0) -> Hypothesis: ...

    def finalize_stream(self, state: Any, row: int = 0) -> list[Hypothesis]: ...


@dataclass(frozen=True)
class StreamHandle:
    """A (decoder, state) pair that reads like a stand-alone decoder for one stream."""

    decoder: StreamingDecoder
    state: Any

    @property
    def config(self) -> Any:
        return self.decoder.config

    def decode_chunk(self, log_probs: torch.Tensor, lengths: torch.Tensor | None = None) -> None:
        """Advance the stream by one chunk of (batch, T, V) log-probs."""
        self.decoder.decode_chunk(log_probs, self.state, lengths)

    def step(self, log_probs: torch.Tensor, lengths: torch.Tensor | None = None) -> Hypothesis:
        """``decode_chunk`` then ``partial``."""
        self.decode_chunk(log_probs, lengths)
        return self.partial()

    def partial(self, row: int = 0) -> Hypothesis:
        return self.decoder.partial(self.state, row)

    def finalize_stream(self, row: int = 0) -> list[Hypothesis]:
        """The n-best of the stream so far, best first."""
        return self.decoder.finalize_stream(self.state, row)


@dataclass
class _CtcSlot:
    state: Any
    batch: int
    vocab_size: int


class CtcStateCacheManager:
    """One shared decoder plus a pool of its per-stream states.

    A freed stream's state goes back to the pool with its device buffers; the next stream reuses
    it after ``decoder.reset_state`` (no fresh device allocation on admission). States are
    handed out LIFO (the most recently freed first, still warm in the allocator's caches).
    """

    def __init__(
        self,
        decoder: GpuStreamingDecoder | GpuDecoderConfig | None = None,
        tokenizer: Tokenizer | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if decoder is None or isinstance(decoder, GpuDecoderConfig):
            decoder = GpuStreamingDecoder(decoder, tokenizer, device)
        elif tokenizer is not None or device is not None:
            raise ValueError("tokenizer/device apply only when the manager builds the decoder")
        self.decoder: GpuStreamingDecoder = decoder
        self._pool: list[Any] = []
        self._streams: dict[int, _CtcSlot] = {}

    @property
    def num_pooled_states(self) -> int:
        """States waiting in the pool for the next stream."""
        return len(self._pool)

    @property
    def stream_ids(self) -> list[int]:
        return list(self._streams)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._streams

    def allocate_stream(self, stream_id: int, batch: int = 1, vocab_size: int | None = None) -> None:
        """Give the stream a fresh state of ``batch`` rows: a pooled one reset in place, else new.

        Args:
            stream_id: any int not allocated here.
            batch: hypothesis rows of the state (1 for one stream).
            vocab_size: CTC outputs (required; positional as ``allocate_stream(sid, 1, V)``).
        Raises:
            ValueError: duplicate stream id, or no ``vocab_size``.
        """
        if vocab_size is None:
            raise ValueError(f"allocate_stream({stream_id}) needs vocab_size (the CTC outputs)")
        if stream_id in self._streams:
            raise ValueError(f"stream {stream_id} already has a CTC decoder state")
        if self._pool:
            state = self._pool.pop()
            self.decoder.reset_state(state, batch, vocab_size)
        else:
            state = self.decoder.create_state(batch, vocab_size)
        self._streams[stream_id] = _CtcSlot(state, batch, vocab_size)

    def free_stream(self, stream_id: int) -> None:
        """Return the stream's state to the pool (its buffers are kept for reuse)."""
        self._pool.append(self._get(stream_id).state)
        del self._streams[stream_id]

    def reset_stream(self, stream_id: int) -> None:
        """Rewind the stream's state in place (an endpoint: the next segment starts fresh)."""
        slot = self._get(stream_id)
        self.decoder.reset_state(slot.state, slot.batch, slot.vocab_size)

    def get_state(self, stream_id: int) -> Any:
        return self._get(stream_id).state

    def get_decoder(self, stream_id: int) -> StreamHandle:
        """The stream's (decoder, state) handle."""
        return StreamHandle(self.decoder, self._get(stream_id).state)

    def _get(self, stream_id: int) -> _CtcSlot:
        try:
            return self._streams[stream_id]
        except KeyError:
            raise KeyError(f"stream {stream_id} has no CTC decoder state") from None
