"""Per-stream CTC decoder state around one shared streaming decoder.

The cache layer sits below decoding and imports none of it: the manager is handed its decoder
through the `StreamingDecoder` protocol, or a `DecoderFactory` (a config that builds its
decoder, as `oasr.decoding.GpuDecoderConfig.build_decoder` does) for the specification's
``CtcStateCacheManager(GpuDecoderConfig(beam_size=10))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch


class StreamingDecoder(Protocol):
    """The decoder interface the manager and a ``StreamHandle`` call (``GpuStreamingDecoder``
    has it). Results (``partial``, ``finalize_stream``) are the decoder's hypothesis type.

    A batch-1 state made with ``row`` lives in that row of the decoder's storage until
    ``free_state``; the manager passes the stream's slot.
    """

    @property
    def config(self) -> Any: ...

    def create_state(self, batch: int, vocab_size: int, row: int | None = None) -> Any: ...

    def reset_state(self, state: Any, batch: int, vocab_size: int) -> None: ...

    def free_state(self, state: Any) -> None: ...

    def decode_chunk(
        self, log_probs: torch.Tensor, state: Any, lengths: torch.Tensor | None = None
    ) -> None: ...

    def partial(self, state: Any, row: int = 0) -> Any: ...

    def finalize_stream(self, state: Any, row: int = 0) -> list[Any]: ...


D = TypeVar("D", bound=StreamingDecoder)
D_co = TypeVar("D_co", bound=StreamingDecoder, covariant=True)


@runtime_checkable
class DecoderFactory(Protocol[D_co]):
    """A decoder config that builds its decoder (``GpuDecoderConfig.build_decoder``)."""

    def build_decoder(self, tokenizer: Any = None, device: Any = None) -> D_co: ...


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

    def step(self, log_probs: torch.Tensor, lengths: torch.Tensor | None = None) -> Any:
        """``decode_chunk`` then ``partial``."""
        self.decode_chunk(log_probs, lengths)
        return self.partial()

    def partial(self, row: int = 0) -> Any:
        return self.decoder.partial(self.state, row)

    def finalize_stream(self, row: int = 0) -> list[Any]:
        """The n-best of the stream so far, best first."""
        return self.decoder.finalize_stream(self.state, row)


@dataclass
class _CtcStream:
    state: Any
    batch: int
    vocab_size: int


class CtcStateCacheManager(Generic[D]):
    """One shared decoder plus the state of every stream.

    One pool: a stream's batch-1 state is a row of the decoder's persistent storage, the row
    of the stream's slot, so a freed stream's buffers stay in place and the next stream of
    that slot is reset into them (no device allocation on admission). ``free_stream`` gives
    the row back explicitly, on the thread that decodes; nothing is released by a garbage
    collector. A state of several rows (``batch > 1``) owns its tensors and is dropped when
    its stream is freed.
    """

    def __init__(
        self,
        decoder: D | DecoderFactory[D],
        tokenizer: Any = None,
        device: torch.device | str | None = None,
    ) -> None:
        """
        Args:
            decoder: the shared decoder, or a config that builds it (``GpuDecoderConfig``).
            tokenizer, device: passed to the factory; only with a factory.
        Raises:
            ValueError: ``tokenizer`` or ``device`` given with a built decoder.
        """
        if isinstance(decoder, DecoderFactory):
            decoder = decoder.build_decoder(tokenizer, device)
        elif tokenizer is not None or device is not None:
            raise ValueError("tokenizer/device apply only when the manager builds the decoder")
        self.decoder: D = decoder
        self._streams: dict[int, _CtcStream] = {}

    @property
    def stream_ids(self) -> list[int]:
        return list(self._streams)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._streams

    def allocate_stream(
        self, stream_id: int, batch: int = 1, vocab_size: int | None = None,
        slot: int | None = None,
    ) -> None:
        """Give the stream a fresh state of ``batch`` rows.

        Args:
            stream_id: any int not allocated here.
            batch: hypothesis rows of the state (1 for one stream).
            vocab_size: CTC outputs (required; positional as ``allocate_stream(sid, 1, V)``).
            slot: the stream's slot, whose decoder row the state lives in (batch 1 only);
                None takes the lowest free row (a manager used alone).
        Raises:
            ValueError: duplicate stream id, no ``vocab_size``, or a slot whose row is held.
        """
        if vocab_size is None:
            raise ValueError(f"allocate_stream({stream_id}) needs vocab_size (the CTC outputs)")
        if stream_id in self._streams:
            raise ValueError(f"stream {stream_id} already has a CTC decoder state")
        state = self.decoder.create_state(batch, vocab_size, slot)
        self._streams[stream_id] = _CtcStream(state, batch, vocab_size)

    def free_stream(self, stream_id: int) -> None:
        """Give the stream's decoder row back (its buffers stay for the slot's next stream).

        Raises:
            KeyError: unknown or already freed stream.
        """
        self.decoder.free_state(self._get(stream_id).state)
        del self._streams[stream_id]

    def reset_stream(self, stream_id: int) -> None:
        """Rewind the stream's state in place (an endpoint: the next segment starts fresh)."""
        stream = self._get(stream_id)
        self.decoder.reset_state(stream.state, stream.batch, stream.vocab_size)

    def get_state(self, stream_id: int) -> Any:
        return self._get(stream_id).state

    def get_decoder(self, stream_id: int) -> StreamHandle:
        """The stream's (decoder, state) handle."""
        return StreamHandle(self.decoder, self._get(stream_id).state)

    def _get(self, stream_id: int) -> _CtcStream:
        try:
            return self._streams[stream_id]
        except KeyError:
            raise KeyError(f"stream {stream_id} has no CTC decoder state") from None
