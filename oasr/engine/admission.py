"""Admission by latency: a stream is admitted only while the step can still serve every
admitted stream in real time on this machine.

Slots bound how many streams the pool holds; they say nothing about how many the CPU or GPU
can decode as fast as they speak. `StepCost` says that, from a model of the engine's time: a
busy step costs a fixed part whatever it decodes (the model call's setup, the beam search's
per-frame operations, the live-text policy's pass) plus a part per second of audio it
decodes (`StepCostModel`). With ``n`` streams speaking in real time the engine spends a share

    share(n) = fixed_s * steps_per_s(n) + per_audio_s * n

of its thread's time in steps, where ``steps_per_s(n)`` is at most one step per stream per
chunk and at most what the batching hold lets through (`max_steps_per_s`). A new stream is
admitted while ``share(running + 1) <= budget``: the streams already admitted stay real time,
and what is left over is kept for the host work between steps and the second pass.

Both parts are seeded at start-up (`ASREngine.calibrate`: steps of one stream and of several);
once the recent busy steps decoded `MIN_MEASURED_AUDIO_S` of audio the per-audio part is
measured on them (their busy time less the fixed part of each step, per audio second; never
below the seed's), so it follows what the machine gives the engine now. A single average cost
per audio second would charge every new stream the fixed cost of the small steps a light load
runs, and refuse streams the batched step could serve.

The second pass decodes the finals in processes of their own on the same machine, and its
capacity is another bound (`SecondPassCost`, with ``EngineConfig.admission_second_pass_budget``):
its decoders' busy share over the last `DECODER_WINDOW_S`, per running stream, says how many
streams keep it within its budget. It is read only while more streams run than refine
partials (refinements take the decoders' spare time, not a share per stream).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

UNBOUNDED = 1 << 30  # room while nothing bounds it but the slots
# audio decoded in the recent window before its measure replaces the start-up seed, seconds
MIN_MEASURED_AUDIO_S = 5.0
# the second pass's decoders are measured over this long (finals come in bursts), seconds
DECODER_WINDOW_S = 20.0
# ... and priced once the window is at least this long
MIN_DECODER_WINDOW_S = 10.0


@dataclass(frozen=True)
class StepCostModel:
    """What a busy step costs the engine thread: ``fixed_s + per_audio_s * audio_s``.

    Attributes:
        fixed_s: seconds every busy step costs, whatever it decodes.
        per_audio_s: seconds per second of audio it decodes (the streams' chunks summed).
    """

    fixed_s: float
    per_audio_s: float

    def __post_init__(self) -> None:
        if not (self.fixed_s >= 0.0 and self.per_audio_s >= 0.0):  # also refuses NaN
            raise ValueError(f"step costs must be >= 0, got {self}")

    @classmethod
    def fit(cls, small: tuple[float, int, float], large: tuple[float, int, float]) -> StepCostModel:
        """The model through two measured loads, each ``(busy seconds, busy steps, audio
        seconds)``: ``small`` with few streams per step, ``large`` with many. Where the
        two do not give a positive fixed and per-audio part (timing noise), the large load's
        average cost per audio second with no fixed part, which overcharges nothing that was
        measured."""
        (busy_a, steps_a, audio_a), (busy_b, steps_b, audio_b) = small, large
        if min(steps_a, steps_b) < 1 or min(audio_a, audio_b) <= 0.0:
            raise ValueError(f"each load needs steps and audio, got {small} and {large}")
        det = steps_a * audio_b - steps_b * audio_a
        if det > 0.0:
            fixed = (busy_a * audio_b - busy_b * audio_a) / det
            per_audio = (steps_a * busy_b - steps_b * busy_a) / det
            if fixed >= 0.0 and per_audio > 0.0:
                return cls(fixed_s=fixed, per_audio_s=per_audio)
        return cls(fixed_s=0.0, per_audio_s=busy_b / audio_b)


@dataclass(frozen=True)
class RecentLoad:
    """The engine's busy steps over a recent window.

    Attributes:
        busy_s: seconds spent in them.
        audio_s: seconds of audio they decoded (every stream's chunks summed).
        num_steps: how many there were.
    """

    busy_s: float
    audio_s: float
    num_steps: int


@dataclass(frozen=True)
class DecoderLoad:
    """The second pass's decoders over a recent window.

    Attributes:
        busy_s: seconds they spent in decoder steps, all together.
        window_s: the window's length, seconds.
        num_decoders: decoders working side by side (processes).
        avg_streams: running streams, averaged over the window's steps.
    """

    busy_s: float
    window_s: float
    num_decoders: int
    avg_streams: float


class SecondPassCost:
    """How many streams the second pass's decoders serve within ``budget`` of their time.

    Args:
        recent: the decoders' recent load (None: nothing measured yet).
        budget: the share of the decoders' time the running streams may need (0, 1].
        min_streams: priced only while more streams than this run on average (below it
            refinements use the decoders' spare time).
    """

    def __init__(self, recent: Callable[[], DecoderLoad | None], budget: float,
                 min_streams: float = 0.0) -> None:
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"second-pass admission budget must be in (0, 1], got {budget}")
        self.recent = recent
        self.budget = budget
        self.min_streams = min_streams

    @property
    def share_per_stream(self) -> float | None:
        """The decoders' busy share one running stream costs; None: not priced now."""
        load = self.recent()
        if (load is None or load.window_s < MIN_DECODER_WINDOW_S or load.num_decoders < 1
                or load.avg_streams <= self.min_streams or load.busy_s <= 0.0):
            return None
        return load.busy_s / (load.window_s * load.num_decoders) / load.avg_streams

    def capacity(self) -> int | None:
        """The most streams within the budget; None: not priced now."""
        per_stream = self.share_per_stream
        return None if per_stream is None else math.floor(self.budget / per_stream)


class StepCost:
    """The engine's share of time ``n`` real-time streams need, and room for more.

    Args:
        recent: the recent busy steps (the engine's stats).
        budget: the share of the engine thread's time the admitted streams may need (0, 1].
        chunk_s: seconds of audio a stream's chunk holds (a stream asks for at most one step
            per chunk).
        max_steps_per_s: the most steps a second the engine takes whatever the streams
            (the batching hold's bound); None: no bound but the chunks'.
        seed: the model before enough audio was decoded to measure it; None: unknown (then
            slots alone bound admission until steps have run).
        second_pass: the second pass's bound as well; None: the step's alone.
    """

    def __init__(self, recent: Callable[[], RecentLoad], budget: float, chunk_s: float,
                 max_steps_per_s: float | None = None, seed: StepCostModel | None = None,
                 second_pass: SecondPassCost | None = None) -> None:
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"admission budget must be in (0, 1], got {budget}")
        if not chunk_s > 0.0:
            raise ValueError(f"chunk_s must be > 0, got {chunk_s}")
        if max_steps_per_s is not None and not max_steps_per_s > 0.0:
            raise ValueError(f"max_steps_per_s must be > 0 or None, got {max_steps_per_s}")
        self.recent = recent
        self.budget = budget
        self.chunk_s = chunk_s
        self.max_steps_per_s = max_steps_per_s
        self.seed = seed
        self.second_pass = second_pass

    @property
    def model(self) -> StepCostModel | None:
        """The seed's fixed part with the per-audio part measured on the recent steps once
        they decoded `MIN_MEASURED_AUDIO_S` (never below the seed's); the seed before that,
        or with no seed the recent steps' average cost; None when nothing is known yet."""
        load = self.recent()
        measured = load.audio_s >= MIN_MEASURED_AUDIO_S
        if self.seed is None:
            return StepCostModel(0.0, load.busy_s / load.audio_s) if measured else None
        if not measured:
            return self.seed
        fixed = self.seed.fixed_s
        per_audio = max(0.0, load.busy_s - fixed * load.num_steps) / load.audio_s
        return StepCostModel(fixed, max(per_audio, self.seed.per_audio_s))

    @property
    def per_audio_s(self) -> float | None:
        """Engine seconds per second of one more stream's audio (the model's per-audio part;
        None: not known yet)."""
        model = self.model
        return None if model is None else model.per_audio_s

    def steps_per_s(self, num_streams: int) -> float:
        """The most busy steps a second ``num_streams`` real-time streams make the engine take."""
        rate = num_streams / self.chunk_s
        return rate if self.max_steps_per_s is None else min(rate, self.max_steps_per_s)

    def share(self, num_streams: int, model: StepCostModel) -> float:
        """The share of the engine thread's time ``num_streams`` real-time streams need."""
        return model.fixed_s * self.steps_per_s(num_streams) + model.per_audio_s * num_streams

    def capacity(self, model: StepCostModel) -> int:
        """The most streams whose share fits the budget (``share`` grows with the streams)."""
        per_stream = model.fixed_s / self.chunk_s + model.per_audio_s  # while each adds steps
        if per_stream <= 0.0:
            return UNBOUNDED
        if self.max_steps_per_s is None or self.budget < per_stream * self.knee:
            estimate = self.budget / per_stream
        elif model.per_audio_s <= 0.0:
            return UNBOUNDED
        else:  # past the knee more streams share the steps there are: only their audio adds
            estimate = (self.budget - model.fixed_s * self.max_steps_per_s) / model.per_audio_s
        count = min(math.floor(estimate), UNBOUNDED)
        while self.share(count + 1, model) <= self.budget:  # the closed form's rounding
            count += 1
        while count > 0 and self.share(count, model) > self.budget:
            count -= 1
        return count

    @property
    def knee(self) -> float:
        """The streams from which the steps a second stop growing (infinite without a bound)."""
        if self.max_steps_per_s is None:
            return math.inf
        return self.chunk_s * self.max_steps_per_s

    def room(self, num_running: int) -> int:
        """How many more streams may be admitted beside ``num_running`` (a large number while
        the cost is not known): the step's capacity, and the second pass's when it is
        priced."""
        model = self.model
        capacity = UNBOUNDED if model is None else self.capacity(model)
        decoders = None if self.second_pass is None else self.second_pass.capacity()
        if decoders is not None:
            capacity = min(capacity, decoders)
        # one stream always runs: a machine too slow for one in real time still serves one,
        # and its steps measure the cost again (a seed must never shut the server for good)
        return max(0 if num_running else 1, capacity - num_running)

    def can_admit(self, num_running: int) -> bool:
        return self.room(num_running) > 0
