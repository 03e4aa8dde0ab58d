"""A chunk changes a stream only once all of it succeeded (issue #49, item 1).

The step is forward (K/V written past the committed frames, fixed-extent state staged), decode
(the decoder's rows written when its search completes), then commit. A failure in the CTC head
of a batched call, or in one row's decode, must leave the failing rows as they were before the
chunk: the rows retried alone start where the batch started, and the other rows' results are
those of a run with no failure at all.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
import torch
from engine_helpers import Collector
from support.paths import ZIPFORMER_FIXTURE_DIR

from oasr.engine import ASREngine, EngineConfig, Error
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.runner.model_runner import BatchPlan, StepOutput


def _config(family: str, engine_config: EngineConfig) -> EngineConfig:
    config = replace(engine_config, max_batch_size=4, dtype="float32")
    if family == "zipformer":
        config = replace(config, model=str(ZIPFORMER_FIXTURE_DIR))
    return config


def _refuse_batches(monkeypatch: pytest.MonkeyPatch, owner: object, name: str,
                    failures: list[int]) -> None:
    """``owner.name`` (the head) raises whenever it sees more than one row."""
    head = getattr(owner, name)

    def batch_refusing_head(enc: torch.Tensor) -> torch.Tensor:
        if enc.size(0) > 1:
            failures.append(enc.size(0))
            raise RuntimeError("injected: the head refuses a batch")
        return head(enc)

    monkeypatch.setattr(owner, name, batch_refusing_head)


class Outputs:
    """Each stream's log-probs of every forward that returned (the rows that ran)."""

    def __init__(self, engine: ASREngine) -> None:
        self.log_probs: dict[int, list[torch.Tensor]] = defaultdict(list)
        self._forward = engine.resources.runner.forward
        engine.resources.runner.forward = self.forward  # type: ignore[method-assign]

    def forward(self, plan: BatchPlan) -> StepOutput:
        out = self._forward(plan)
        for row, sid in enumerate(plan.stream_ids):
            self.log_probs[sid].append(out.log_probs[row, : out.lengths[row]].clone())
        return out

    def stream(self, sid: int) -> torch.Tensor:
        return torch.cat(self.log_probs[sid])


def _run(engine: ASREngine, audios: list[np.ndarray]) -> tuple[Collector, Outputs]:
    outputs, events = Outputs(engine), Collector()
    for sid, audio in enumerate(audios, start=1):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    for _ in range(10_000):
        engine.step()
        if not engine.requests:
            return events, outputs
    raise AssertionError("the engine did not finish")


def _audios(speech: list[np.ndarray]) -> list[np.ndarray]:
    return [speech[0][: 16000 * 3], speech[1][: 16000 * 4], speech[2][: 16000 * 3]]


@pytest.mark.parametrize("family", ["conformer", "zipformer"])
def test_a_head_failure_of_the_batch_leaves_every_row_as_before_the_chunk(
        family: str, engine_config: EngineConfig, speech: list[np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The head after the encoder (the Conformer's CTC head, the Zipformer's joiner
    projection) raises whenever it sees more than one row: every batched call fails after the
    encoder ran (and, before the fix, after it wrote the rows' conv or slot state), and each
    row runs alone. Each row alone must equal the clean batched run: it starts from the state
    the batch started from."""
    config = _config(family, engine_config)
    audios = _audios(speech)
    clean_events, clean = _run(ASREngine(config), audios)

    engine = ASREngine(config)
    model = engine.resources.family.model
    failures: list[int] = []
    if family == "zipformer":
        _refuse_batches(monkeypatch, model.joiner.encoder_proj, "forward", failures)
    else:
        _refuse_batches(monkeypatch, model, "ctc_log_probs", failures)
    events, outputs = _run(engine, audios)
    assert failures  # the batched path failed, the rows ran alone
    for sid in range(1, len(audios) + 1):
        assert not events.of_type(sid, Error)
        torch.testing.assert_close(outputs.stream(sid), clean.stream(sid), atol=1e-5, rtol=1e-5)
        assert events.finals(sid) == clean_events.finals(sid)


def test_a_decode_failure_fails_that_row_alone_with_its_state_as_before(
        engine_config: EngineConfig, speech: list[np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream 2's third chunk fails in the decoder (batched and alone). Stream 2 ends with an
    error, holding exactly the K/V frames, conv state and decoder state it had before that
    chunk; streams 1 and 3 decode as in a run without the failure."""
    config = replace(engine_config, dtype="float32")
    audios = _audios(speech)
    clean_events, clean = _run(ASREngine(config), audios)

    engine = ASREngine(config)
    res = engine.resources
    decoder = res.ctc.decoder
    decode_streams = decoder.decode_streams
    decoded_2 = [0]  # decodes of stream 2 that succeeded
    before: dict[str, object] = {}
    at_failure: dict[str, object] = {}

    def snapshot() -> dict[str, object]:
        state = res.ctc.get_state(2)
        return {"frames": res.attention.num_cached_frames(2),
                "conv": res.states.slot_view(2, "cnn").clone(),
                "decoded": int(state.num_frames[0]),
                "prefix": state.prefix_len.clone(), "tokens": state.tokens[..., :64].clone()}

    def failing_decode(log_probs, states, lengths=None):  # type: ignore[no-untyped-def]
        has_2 = 2 in res.ctc and any(s is res.ctc.get_state(2) for s in states)
        if has_2 and decoded_2[0] >= 2:
            if not before:
                before.update(snapshot())
            decode_streams(log_probs, states, lengths)  # the search completes, writes its rows
            raise RuntimeError("injected: decoding fails after stream 2's search")
        decode_streams(log_probs, states, lengths)
        decoded_2[0] += has_2

    fail = engine._fail_forward

    def record_failure(stream_id: int, exc: Exception) -> None:
        if stream_id == 2 and not at_failure:
            at_failure.update(snapshot())
        fail(stream_id, exc)

    monkeypatch.setattr(decoder, "decode_streams", failing_decode)
    monkeypatch.setattr(engine, "_fail_forward", record_failure)
    events, outputs = _run(engine, audios)
    assert [e.code for e in events.of_type(2, Error)] == ["internal"]
    assert at_failure and before
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(at_failure[key], value), key  # type: ignore[arg-type]
        else:
            assert at_failure[key] == value, key
    for sid in (1, 3):
        assert not events.of_type(sid, Error)
        torch.testing.assert_close(outputs.stream(sid), clean.stream(sid), atol=1e-5, rtol=1e-5)
        assert events.finals(sid) == clean_events.finals(sid)
