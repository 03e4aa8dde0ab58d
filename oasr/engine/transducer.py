"""TransducerStreams: each live stream's greedy transducer hypothesis, decoded in batches.

The transducer counterpart of the CTC state pool: one `GreedyState` per stream id (host
data: the token context, tokens, their frames), advanced for a whole cohort per step by one
batched greedy search (one decoder + joiner call per frame for the rows that need it).
Endpointing reads the same inputs as for CTC: a frame is silence when nothing was emitted
at it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from oasr.decoding import FrameStats, Hypothesis
from oasr.models.zipformer.model import ZipformerModel
from oasr.models.zipformer.transducer import GreedyState


@dataclass(frozen=True)
class TransducerStep:
    """One stream's result after a chunk: its current best hypothesis and endpoint inputs."""

    hypothesis: Hypothesis
    stats: FrameStats


class TransducerStreams:
    """Greedy hypotheses by stream id.

    Invariant: a stream id has a state from `allocate_stream` to `free_stream`; freed states
    are kept and reused (reset) for the next stream.
    """

    def __init__(self, model: ZipformerModel, tokenizer: object) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._states: dict[int, GreedyState] = {}
        self._free: list[GreedyState] = []

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._states

    def allocate_stream(self, stream_id: int) -> None:
        """A fresh hypothesis for the stream.

        Raises:
            ValueError: the stream already has one.
        """
        if stream_id in self._states:
            raise ValueError(f"stream {stream_id} already has a transducer state")
        state = self._free.pop() if self._free else self.model.new_greedy_states(1)[0]
        state.reset()
        self._states[stream_id] = state

    def free_stream(self, stream_id: int) -> None:
        self._free.append(self._states.pop(self._check(stream_id)))

    def reset_stream(self, stream_id: int) -> None:
        """Start a new segment (an endpoint): empty hypothesis, start context."""
        self._states[self._check(stream_id)].reset()

    def decode(self, stream_ids: list[int], frames: Tensor, lengths: list[int]) -> list[TransducerStep]:
        """Advance the cohort's hypotheses over its new frames in one batched search.

        Args:
            frames: (B, T, joiner_dim) joiner-projected encoder frames, rows in ``stream_ids``
                order; lengths: valid frames per row.
        """
        states = [self._states[self._check(s)] for s in stream_ids]
        self.model.greedy_step(frames, lengths, states)
        return [TransducerStep(self._hypothesis(s), self._stats(s)) for s in states]

    def final_hypothesis(self, stream_id: int) -> Hypothesis:
        return self._hypothesis(self._states[self._check(stream_id)])

    def _hypothesis(self, state: GreedyState) -> Hypothesis:
        text = self.tokenizer.decode(state.tokens)  # type: ignore[attr-defined]
        return Hypothesis(tokens=list(state.tokens), text=text, score=0.0,
                          timestamps=list(state.frames))

    @staticmethod
    def _stats(state: GreedyState) -> FrameStats:
        last = state.frames[-1] + 1 if state.frames else 0
        return FrameStats(num_frames=state.num_frames,
                          num_trailing_blank_frames=state.num_frames - last,
                          has_speech=bool(state.tokens))

    def _check(self, stream_id: int) -> int:
        if stream_id not in self._states:
            raise KeyError(f"stream {stream_id} has no transducer state")
        return stream_id
