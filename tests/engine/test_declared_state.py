"""Declared fixed-extent state (issue #49, item 3): an encoder lists its
`StreamStateSpec`s and its chunk forward reads them by name from ``states``; the engine
allocates, zeroes, gathers, scatters and resets whatever is declared, with no change to the
engine or to a family adapter. A persistent state is written at admission from the model's
``stream_conditioning`` and survives a reset; a runtime that cannot write it refuses the model.
The Zipformer's slot specs come from its own init states on the meta device.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import Collector
from support.paths import ZIPFORMER_FIXTURE_DIR

from oasr.cache import StreamStateSpec
from oasr.engine import ASREngine, EngineConfig, Error
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.families import ConformerFamily
from oasr.engine.runner.model_runner import BatchPlan, StepOutput
from oasr.engine.runner.streams import StreamResources
from oasr.models import AsrModel, load_model
from oasr.models.conformer import ConformerEncoder

MEAN, PROMPT = "toy.mean", "toy.prompt"


class ToyEncoder(ConformerEncoder):
    """The Conformer encoder plus two declared states and nothing else: ``toy.mean`` (D,), a
    running mean of the stream's output frames added back into every later chunk (so a
    stream's output depends on its own past through it), and ``toy.prompt`` (1,), persistent:
    a per-stream value scaled into the output (a language-prompt id, say)."""

    @property
    def streaming_state_specs(self) -> tuple[StreamStateSpec, ...]:
        width = self.config.output_size
        return (*super().streaming_state_specs, StreamStateSpec(MEAN, (width,)),
                StreamStateSpec(PROMPT, (1,), persistent=True))

    def stream_conditioning(self, stream_id: int) -> dict[str, float]:
        return {PROMPT: float(stream_id)}

    def forward_chunk_paged(self, xs, xs_lens, offsets, att_caches, cnn_cache=None,  # type: ignore[no-untyped-def, override]
                            max_offset=None, cache_t1=None, *, states=None):
        ys, lens, new = super().forward_chunk_paged(xs, xs_lens, offsets, att_caches, cnn_cache,
                                                    max_offset, cache_t1, states=states)
        if states is None:
            return ys, lens, new
        mean, prompt = states[MEAN], states[PROMPT]
        ys = ys + mean.gather()[:, None, :] + 0.1 * prompt.gather()[:, None, :]  # (B, T', D)
        valid = (torch.arange(ys.size(1), device=ys.device) < lens[:, None]).to(ys.dtype)
        frames = (ys * valid[..., None]).sum(1) / lens.clamp(min=1)[:, None].to(ys.dtype)
        mean.scatter(0.5 * mean.gather() + 0.5 * frames)  # (B, D)
        return ys, lens, new


class Unconditioned(ToyEncoder):
    """Declares the persistent prompt but gives no values for it."""

    stream_conditioning = None  # type: ignore[assignment]


def _toy_model(model_dir: Path, encoder_class: type[ConformerEncoder] = ToyEncoder) -> AsrModel:
    model = load_model(str(model_dir))
    assert isinstance(model, AsrModel)
    toy = encoder_class(model.encoder.config)
    toy.load_state_dict(model.encoder.state_dict())
    model.encoder = toy.eval()
    return model


class Outputs:
    """Each stream's log-probs, in order."""

    def __init__(self, engine: ASREngine) -> None:
        self.log_probs: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.batch_sizes: list[int] = []
        self._forward = engine.resources.runner.forward
        engine.resources.runner.forward = self.forward  # type: ignore[method-assign]

    def forward(self, plan: BatchPlan) -> StepOutput:
        out = self._forward(plan)
        self.batch_sizes.append(len(plan.stream_ids))
        for row, sid in enumerate(plan.stream_ids):
            self.log_probs[sid].append(out.log_probs[row, : out.lengths[row]].clone())
        return out


def _run(config: EngineConfig, model: AsrModel, streams: dict[int, np.ndarray]
         ) -> tuple[ASREngine, Collector, Outputs]:
    engine = ASREngine(config, StreamResources.build(config, model))
    outputs, events = Outputs(engine), Collector()
    for sid, audio in streams.items():
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    for _ in range(10_000):
        engine.step()
        if not engine.requests:
            return engine, events, outputs
    raise AssertionError("the engine did not finish")


def test_a_toy_state_added_to_the_encoder_runs_batched_as_alone(
        engine_config: EngineConfig, tiny_model_dir: Path, speech: list[np.ndarray]) -> None:
    config = replace(engine_config, dtype="float32")
    streams = {1: speech[0][: 16000 * 3], 2: speech[1][: 16000 * 4], 5: speech[2][: 16000 * 3]}
    engine, events, batched = _run(config, _toy_model(tiny_model_dir), streams)
    assert isinstance(engine.resources.family, ConformerFamily)  # the adapter as shipped
    assert set(engine.resources.states.specs) == {"cnn", MEAN, PROMPT}
    assert max(batched.batch_sizes) == 3
    _, plain_events, plain = _run(config, load_model(str(tiny_model_dir)), streams)
    for sid, audio in streams.items():
        _, alone_events, alone = _run(replace(config, max_batch_size=1),
                                      _toy_model(tiny_model_dir), {sid: audio})
        mine = torch.cat(batched.log_probs[sid])
        torch.testing.assert_close(mine, torch.cat(alone.log_probs[sid]), atol=1e-5, rtol=1e-5)
        assert events.finals(sid) == alone_events.finals(sid)
        assert not events.of_type(sid, Error)
        # the state is used: without it the stream decodes other log-probs
        assert (mine - torch.cat(plain.log_probs[sid])).abs().max() > 1e-3


def test_the_engine_zeroes_gathers_and_resets_what_is_declared_and_keeps_the_persistent(
        engine_config: EngineConfig, tiny_model_dir: Path, speech: list[np.ndarray]) -> None:
    config = replace(engine_config, dtype="float32")
    res = StreamResources.build(config, _toy_model(tiny_model_dir))
    engine = ASREngine(config, res)
    for sid in (3, 7):
        engine.submit(OpenStream(sid, lambda event: None))
        engine.submit(AppendAudio(sid, speech[sid % 4][: 16000 * 2]))
    for _ in range(3):
        engine.step()
    for sid in (3, 7):
        assert res.states.slot_view(sid, MEAN).abs().sum() > 0  # written by the chunks
        assert res.states.slot_view(sid, PROMPT).flatten().tolist() == [float(sid)]
    res.reset_stream(3)  # an endpoint
    assert not res.states.slot_view(3, MEAN).any() and not res.states.slot_view(3, "cnn").any()
    assert res.states.slot_view(3, PROMPT).flatten().tolist() == [3.0]  # kept
    assert res.states.slot_view(7, MEAN).abs().sum() > 0  # the other stream untouched
    slot = res.states.slot_of(3)
    res.close_stream(3)
    assert res.open_stream(11) == slot  # the slot's next stream starts from zeros + its own
    assert not res.states.slot_view(11, MEAN).any()
    assert res.states.slot_view(11, PROMPT).flatten().tolist() == [11.0]


def test_persistent_state_nobody_can_write_is_refused_at_construction(
        engine_config: EngineConfig, tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"persistent states \['toy.prompt'\] but has no "
                                         r"stream_conditioning"):
        StreamResources.build(engine_config, _toy_model(tiny_model_dir, Unconditioned))

    class CannotCondition(StreamResources):
        carries_encoder_conditioning = False

    with pytest.raises(ValueError, match="cannot write them"):
        CannotCondition.build(engine_config, _toy_model(tiny_model_dir))
    CannotCondition.build(engine_config, load_model(str(tiny_model_dir)))  # nothing persistent


def test_the_zipformer_slot_specs_are_its_own_init_states() -> None:
    """`slot_state_specs` comes from `get_streaming_init_states` on the meta device:
    each spec stores exactly the tensor the model's modules start from, for any batch."""
    model = load_model(str(ZIPFORMER_FIXTURE_DIR), chunk_size=16, left_context_frames=64)
    assert model.streaming_kind == "slot"
    specs = model.slot_state_specs
    init = model.get_streaming_init_states(3)
    assert [s.name for s in specs] == list(init)  # icefall's order
    for spec in specs:
        assert spec.stored_shape(3) == tuple(init[spec.name].shape), spec.name
        assert (spec.dtype or torch.float32) == init[spec.name].dtype
    assert sum(1 for s in specs if s.slot_axis == 1) == 4 * 6  # key / nonlin / values per layer
    assert not any(t.is_meta for t in init.values())
    wider = load_model(str(ZIPFORMER_FIXTURE_DIR), chunk_size=16, left_context_frames=128)
    assert wider.slot_state_specs[0].shape == (128, specs[0].shape[1])  # follows the modules
