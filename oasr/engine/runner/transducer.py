"""TransducerStreams: each live stream's transducer search state, decoded in batches.

The transducer counterpart of the CTC state pool: one search state per stream id (host data:
token contexts, tokens, their frames), advanced for a whole cohort per step by one batched
search: greedy (`GreedyState`, beam 1) or icefall's modified beam search (`BeamState`), one
decoder + joiner call per frame. Endpointing reads the same inputs as for CTC, from the best
hypothesis: a frame is silence when it emitted nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from oasr.decoding import FrameStats, Hypothesis
from oasr.models.zipformer.beam_search import BeamState
from oasr.models.zipformer.model import ZipformerModel
from oasr.models.zipformer.transducer import GreedyState

SearchState = GreedyState | BeamState


@dataclass(frozen=True)
class TransducerStep:
    """One stream's result after a chunk: its current best hypothesis and endpoint inputs."""

    hypothesis: Hypothesis
    stats: FrameStats


class TransducerStreams:
    """Search states by stream id: greedy at ``beam`` 1, else modified beam search.

    Invariant: a stream id has a state from `allocate_stream` to `free_stream`; freed states
    are kept and reused (reset) for the next stream.
    """

    def __init__(self, model: ZipformerModel, tokenizer: object, beam: int = 1) -> None:
        if beam < 1:
            raise ValueError(f"beam must be >= 1 (1 = greedy), got {beam}")
        self.model = model
        self.tokenizer = tokenizer
        self.beam = beam
        self._states: dict[int, SearchState] = {}
        self._free: list[SearchState] = []

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._states

    def allocate_stream(self, stream_id: int) -> None:
        """A fresh hypothesis for the stream.

        Raises:
            ValueError: the stream already has one.
        """
        if stream_id in self._states:
            raise ValueError(f"stream {stream_id} already has a transducer state")
        if self._free:
            state = self._free.pop()
        elif self.beam == 1:
            state = self.model.new_greedy_states(1)[0]
        else:
            state = self.model.new_beam_states(1)[0]
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

        Raises whatever the search raises, with every state as it was before the call (a
        chunk is committed only when all of it succeeded).
        """
        states = [self._states[self._check(s)] for s in stream_ids]
        restore = self.checkpoint(stream_ids)
        try:
            if self.beam == 1:
                self.model.greedy_step(frames, lengths, states)  # type: ignore[arg-type]
            else:
                self.model.beam_step(frames, lengths, states, self.beam)  # type: ignore[arg-type]
            return [TransducerStep(self._hypothesis(s), self._stats(s)) for s in states]
        except BaseException:
            restore()
            raise

    def checkpoint(self, stream_ids: list[int]) -> Callable[[], None]:
        """A way back for the streams' hypotheses: calling the result puts them as they are
        now (cheap: a greedy search only appends, a beam search replaces its dict)."""
        states = [self._states[self._check(s)] for s in stream_ids]
        marks = [_mark(s) for s in states]

        def restore() -> None:
            for state, mark in zip(states, marks, strict=True):
                _rewind(state, mark)
        return restore

    def final_hypothesis(self, stream_id: int) -> Hypothesis:
        return self._hypothesis(self._states[self._check(stream_id)])

    def _hypothesis(self, state: SearchState) -> Hypothesis:
        tokens, frames, score = _best(state)
        text = self.tokenizer.decode(tokens)  # type: ignore[attr-defined]
        return Hypothesis(tokens=tokens, text=text, score=score, timestamps=frames)

    @staticmethod
    def _stats(state: SearchState) -> FrameStats:
        tokens, frames, _ = _best(state)
        last = frames[-1] + 1 if frames else 0
        return FrameStats(num_frames=state.num_frames,
                          num_trailing_blank_frames=state.num_frames - last,
                          has_speech=bool(tokens))

    def _check(self, stream_id: int) -> int:
        if stream_id not in self._states:
            raise KeyError(f"stream {stream_id} has no transducer state")
        return stream_id


def _mark(state: SearchState) -> tuple[object, ...]:
    """What `_rewind` needs to put ``state`` back: a greedy search only appends to its
    lists, and a beam search replaces its hypothesis dict, so lengths and the dict suffice."""
    if isinstance(state, BeamState):
        return (state.hyps, state.num_frames)
    return (len(state.context), len(state.tokens), len(state.frames), state.num_frames)


def _rewind(state: SearchState, mark: tuple[object, ...]) -> None:
    if isinstance(state, BeamState):
        state.hyps, state.num_frames = mark  # type: ignore[assignment]
        return
    num_context, num_tokens, num_frames, consumed = mark
    del state.context[num_context:], state.tokens[num_tokens:], state.frames[num_frames:]  # type: ignore[index]
    state.num_frames = consumed  # type: ignore[assignment]


def _best(state: SearchState) -> tuple[list[int], list[int], float]:
    """(tokens, their frames, log-probability; 0 for greedy, which keeps no score)."""
    if isinstance(state, BeamState):
        best = state.best()
        return list(best.tokens), list(best.frames), best.log_prob
    return list(state.tokens), list(state.frames), 0.0
