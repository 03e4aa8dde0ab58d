"""``backend.limits``: JSON depth before parsing, the audio flow gate, the body deadline."""

from __future__ import annotations

import asyncio
import json

import pytest

from backend.limits import (
    FLOW_POLL_S,
    AudioFlowGate,
    BodyDeadline,
    JsonTooDeep,
    json_depth_exceeds,
    loads_bounded,
)


@pytest.mark.parametrize(("text", "depth"), [
    ('{"type": "start"}', 1), ("[[[]]]", 3), ('{"a": [{"b": []}]}', 4), ("1", 0),
    ('"[[[[[[[["', 0), ('{"a": "\\"[[[["}', 1), ("[" * 2000, 2000)])
def test_json_depth_is_counted_outside_strings(text: str, depth: int) -> None:
    assert not json_depth_exceeds(text, depth)
    assert json_depth_exceeds(text, depth - 1) == (depth > 0)


def test_loads_bounded_refuses_deep_json_and_parses_the_rest() -> None:
    with pytest.raises(JsonTooDeep, match="deeper than 8"):
        loads_bounded("[" * 2000 + "]" * 2000, 8)
    assert loads_bounded('{"type": "start", "x": [[1]]}', 8) == json.loads(
        '{"type": "start", "x": [[1]]}')
    with pytest.raises(ValueError):
        loads_bounded("{", 8)


class Polls:
    """The flow gate's sleep between two looks at a queue: counts the looks, waits no time."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, seconds: float) -> None:
        self.count += 1
        await asyncio.sleep(0)

    async def at_least(self, count: int, waiter: asyncio.Task[None]) -> None:
        """Return once the gate has looked ``count`` more times, or ``waiter`` is done."""
        target = self.count + count
        while self.count < target and not waiter.done():
            await asyncio.sleep(0)


def test_flow_gate_pauses_a_socket_over_its_limit_until_the_engine_catches_up() -> None:
    queued = {1: 6.0, 2: 0.0}
    polls = Polls()
    gate = AudioFlowGate(lambda sid: queued[sid], max_socket_s=5.0, max_total_s=8.0,
                         sleep=polls)

    async def scenario() -> None:
        waiter = asyncio.create_task(gate.wait_for_room(1))
        await polls.at_least(5, waiter)
        assert not waiter.done()  # 6 s queued > 5 s: not reading
        await gate.wait_for_room(2)  # another socket with nothing queued is not held up
        queued[1] = 4.0
        await asyncio.wait_for(waiter, 1.0)

    asyncio.run(scenario())
    assert gate.num_pauses == 1


def test_flow_gate_holds_sockets_with_audio_queued_while_over_the_global_budget() -> None:
    queued = {1: 4.0, 2: 4.5, 3: 0.9}
    polls = Polls()
    gate = AudioFlowGate(lambda sid: queued[sid], max_socket_s=5.0, max_total_s=8.0,
                         sleep=polls)

    async def scenario() -> None:
        await gate.wait_for_room(1)  # 4 s alone: under both limits
        waiter = asyncio.create_task(gate.wait_for_room(2))  # 8.5 s in all > 8 s
        await polls.at_least(5, waiter)
        assert not waiter.done()
        # under a chunk's worth queued (the 1 s floor) may always send: the engine may need
        # more audio before it can decode anything of that stream
        await asyncio.wait_for(gate.wait_for_room(3), 0.5)
        queued[1] = 1.0
        await asyncio.wait_for(waiter, 1.0)
        for stream_id in (1, 2, 3):
            gate.forget(stream_id)
        assert gate.total_queued_s == 0.0

    asyncio.run(scenario())


def test_flow_gate_never_holds_a_stream_below_its_next_chunk() -> None:
    queued = {1: 1.2}
    polls = Polls()
    gate = AudioFlowGate(lambda sid: queued[sid], max_socket_s=0.5, max_total_s=0.5,
                         floor_s=lambda: 1.28, sleep=polls)  # two 640 ms chunks

    async def scenario() -> None:
        await asyncio.wait_for(gate.wait_for_room(1), 0.5)  # over both limits, under the floor
        assert polls.count == 0
        queued[1] = 1.5
        waiter = asyncio.create_task(gate.wait_for_room(1))
        await polls.at_least(5, waiter)
        assert not waiter.done()
        queued[1] = 1.0
        await asyncio.wait_for(waiter, 1.0)

    asyncio.run(scenario())


def test_flow_gate_checks_cost_the_same_however_many_streams_queue() -> None:
    """A socket's check looks at its own queue; the others' are looked at again at most every
    FLOW_POLL_S, for every waiting socket together (not every stream for every message)."""
    looks: list[int] = []
    queued = {sid: 2.0 for sid in range(1, 101)}  # 200 s in all: over the 120 s budget

    def queued_s(sid: int) -> float:
        looks.append(sid)
        return queued[sid]

    clock = FakeClock()
    gate = AudioFlowGate(queued_s, max_socket_s=5.0, max_total_s=120.0, clock=clock)
    waits = [gate._must_wait(sid) for sid in queued]  # each stream's first message
    assert gate.total_queued_s == pytest.approx(200.0) and waits[-1]
    looks.clear()
    for sid in queued:  # every socket again, within one poll interval
        assert gate._must_wait(sid)
    assert len(looks) == 100  # its own queue each: no look at the 99 others
    for sid in range(1, 61):  # the engine drains 60 streams
        queued[sid] = 0.0
    assert gate._must_wait(100)  # the drained queues are not looked at yet ...
    clock.now += FLOW_POLL_S
    looks.clear()
    assert not gate._must_wait(100)  # ... until the interval has passed: 80 s < 120 s
    assert len(looks) == 101 and gate.total_queued_s == pytest.approx(80.0)
    for sid in queued:
        gate.forget(sid)
    assert gate.total_queued_s == 0.0


def test_flow_gate_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_socket_s"):
        AudioFlowGate(lambda sid: 0.0, max_socket_s=10.0, max_total_s=5.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_a_body_gets_the_timeout_plus_a_second_per_thousand_bytes() -> None:
    clock = FakeClock()
    deadline = BodyDeadline(2.0, clock, min_bytes_per_s=1000)
    assert deadline.seconds_left() == pytest.approx(2.0)
    clock.now += 1.5
    deadline.received(3000)  # 3 s more
    assert deadline.seconds_left() == pytest.approx(3.5)


def test_a_body_at_any_real_rate_never_runs_out_and_a_trickle_does() -> None:
    clock = FakeClock()
    upload, trickle = (BodyDeadline(1.0, clock, 1000), BodyDeadline(1.0, clock, 1000))
    for _ in range(600):  # a minute in 0.1 s steps
        clock.now += 0.1
        upload.received(200)  # 2 KB/s: a slow phone link
        trickle.received(1)  # 10 bytes/s
        assert upload.seconds_left() > 0
    assert trickle.seconds_left() < 0
