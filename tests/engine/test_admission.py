"""Admission by latency's cost model (`oasr.engine.admission`): a step's fixed part and its
part per audio second, the steps a second the streams make, and the capacity they give."""

from __future__ import annotations

import itertools

import pytest

from oasr.engine.admission import (
    MIN_DECODER_WINDOW_S,
    MIN_MEASURED_AUDIO_S,
    DecoderLoad,
    RecentLoad,
    SecondPassCost,
    StepCost,
    StepCostModel,
)

NOTHING = RecentLoad(busy_s=0.0, audio_s=0.0, num_steps=0)


def _cost(recent: RecentLoad = NOTHING, budget: float = 0.8, chunk_s: float = 0.64,
          max_steps_per_s: float | None = None, seed: StepCostModel | None = None,
          second_pass: SecondPassCost | None = None) -> StepCost:
    return StepCost(lambda: recent, budget, chunk_s, max_steps_per_s, seed, second_pass)


def test_without_a_fixed_part_admission_is_linear_in_the_streams() -> None:
    loads = [NOTHING]
    cost = StepCost(lambda: loads[0], budget=0.8, chunk_s=0.64)
    assert cost.per_audio_s is None and cost.room(100) > 1000  # unknown: slots decide
    cost.seed = StepCostModel(fixed_s=0.0, per_audio_s=0.1)  # 8 streams fit in 0.8
    assert cost.room(0) == 8 and cost.room(7) == 1 and not cost.can_admit(8)
    # measured: 0.2 s per audio second (no seed's fixed part to take off)
    loads[0] = RecentLoad(busy_s=1.0, audio_s=MIN_MEASURED_AUDIO_S, num_steps=10)
    assert cost.per_audio_s == pytest.approx(0.2)
    assert cost.room(0) == 4 and cost.room(5) == 0
    cost.seed = None  # no seed: the recent steps' average
    assert cost.per_audio_s == pytest.approx(0.2) and cost.room(0) == 4


def test_a_light_loads_small_steps_do_not_charge_new_streams_their_fixed_cost() -> None:
    # 4 streams, each chunk (0.64 s) in a step of its own for 10 s: 62 steps of 10 ms fixed
    # cost + 5 ms per audio second. Their average cost, 0.0205 s per audio second, would say
    # 0.8 / 0.0205 = 39 streams; batched 10 steps a second, 140 fit.
    seed = StepCostModel(fixed_s=0.01, per_audio_s=0.004)
    steps, audio = 62, 40.0
    recent = RecentLoad(busy_s=steps * 0.01 + audio * 0.005, audio_s=audio, num_steps=steps)
    cost = _cost(recent, max_steps_per_s=10.0, seed=seed)
    assert recent.busy_s / recent.audio_s == pytest.approx(0.0205)
    model = cost.model
    assert model is not None and model.fixed_s == 0.01
    assert model.per_audio_s == pytest.approx(0.005)
    assert cost.room(4) + 4 in (139, 140)  # 140 up to the measure's rounding
    # without the hold's bound every stream may cost a step per chunk: 0.8 / (0.01 / 0.64 + 0.005)
    assert _cost(recent, max_steps_per_s=None, seed=seed).room(4) == 38 - 4


def test_the_per_audio_part_is_never_below_the_seeds() -> None:
    # a window whose fixed parts explain all its busy time measures nothing per audio second
    seed = StepCostModel(fixed_s=0.02, per_audio_s=0.004)
    recent = RecentLoad(busy_s=0.5, audio_s=10.0, num_steps=50)
    assert _cost(recent, max_steps_per_s=10.0, seed=seed).model == seed
    busier = RecentLoad(busy_s=2.0, audio_s=10.0, num_steps=50)
    assert _cost(busier, seed=seed).per_audio_s == pytest.approx((2.0 - 1.0) / 10.0)


@pytest.mark.parametrize("max_steps_per_s", [None, 5.0, 10.0, 40.0])
def test_the_capacity_is_the_most_streams_whose_share_fits(max_steps_per_s: float | None) -> None:
    for fixed, per_audio, budget in itertools.product((0.0, 0.003, 0.02, 0.09),
                                                      (0.0005, 0.004, 0.03), (0.3, 0.8, 1.0)):
        model = StepCostModel(fixed_s=fixed, per_audio_s=per_audio)
        cost = _cost(budget=budget, max_steps_per_s=max_steps_per_s)
        shares = [cost.share(n, model) for n in range(5000)]
        assert shares == sorted(shares)
        fits = max(n for n, share in enumerate(shares) if share <= budget)
        assert cost.capacity(model) == fits, (model, budget)


def test_the_steps_a_second_are_bounded_by_the_chunks_and_the_hold() -> None:
    cost = _cost(chunk_s=0.5, max_steps_per_s=10.0)
    assert [cost.steps_per_s(n) for n in (0, 1, 4, 5, 6, 100)] == [0, 2, 8, 10, 10, 10]
    assert _cost(chunk_s=0.5).steps_per_s(100) == 200


def test_one_stream_runs_however_slow_the_step_is() -> None:
    # a seed measured on a cold start (1.2 s of step per audio second) must not shut the
    # server: one stream is admitted, and its steps measure the cost again
    cost = _cost(seed=StepCostModel(fixed_s=0.5, per_audio_s=1.2))
    assert cost.room(0) == 1 and cost.room(1) == 0


def test_two_loads_give_the_fixed_and_the_per_audio_part() -> None:
    def load(steps: int, audio: float) -> tuple[float, int, float]:
        return steps * 0.012 + audio * 0.003, steps, audio
    model = StepCostModel.fit(load(4, 2.0), load(4, 16.0))
    assert model.fixed_s == pytest.approx(0.012) and model.per_audio_s == pytest.approx(0.003)
    # noise that makes the many-stream steps cheaper than the one-stream ones: the larger
    # load's average, no fixed part
    assert StepCostModel.fit((0.1, 4, 2.0), (0.08, 4, 16.0)) == StepCostModel(0.0, 0.005)
    with pytest.raises(ValueError, match="steps and audio"):
        StepCostModel.fit((0.1, 0, 2.0), (0.2, 4, 16.0))
    with pytest.raises(ValueError, match=">= 0"):
        StepCostModel(fixed_s=-0.1, per_audio_s=0.1)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="admission budget"):
        _cost(budget=1.5)
    with pytest.raises(ValueError, match="chunk_s"):
        _cost(chunk_s=0.0)
    with pytest.raises(ValueError, match="max_steps_per_s"):
        _cost(max_steps_per_s=0.0)


def test_the_second_pass_bounds_admission_by_its_decoders_busy_share() -> None:
    # two decoders busy 60 % of 20 s with 30 streams running: 0.02 of their time a stream,
    # so a budget of 0.7 holds 35 streams, while the step alone would take 140
    loads: list[DecoderLoad | None] = [DecoderLoad(busy_s=24.0, window_s=20.0, num_decoders=2,
                                                   avg_streams=30.0)]
    decoders = SecondPassCost(lambda: loads[0], budget=0.7, min_streams=8)
    assert decoders.share_per_stream == pytest.approx(0.02) and decoders.capacity() == 35
    step = StepCostModel(fixed_s=0.01, per_audio_s=0.005)
    cost = _cost(max_steps_per_s=10.0, seed=step, second_pass=decoders)
    assert cost.capacity(step) == 140 and cost.room(30) == 5 and cost.room(35) == 0
    # not priced: too short a window, too few streams (refinements use the spare time), idle
    for load in (None, DecoderLoad(24.0, MIN_DECODER_WINDOW_S - 1, 2, 30.0),
                 DecoderLoad(24.0, 20.0, 2, 8.0), DecoderLoad(0.0, 20.0, 2, 30.0)):
        loads[0] = load
        assert decoders.capacity() is None and cost.room(30) == 140 - 30
    with pytest.raises(ValueError, match="second-pass admission budget"):
        SecondPassCost(lambda: None, budget=0.0)
