"""Int8 Linear layers: error bound against float, odd shapes, the swap, and both encoder
families streaming through the engine's runner in int8 against float on real speech."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from support.paths import DEVSET_DIR
from torch import nn

from oasr.audio import ChunkWindower, read_audio
from oasr.engine import EngineConfig
from oasr.engine.runner.model_runner import BatchPlan
from oasr.engine.runner.streams import StreamResources
from oasr.models import AsrModel
from oasr.models.int8 import Int8Linear, count_int8_linears, quantize_linears, quantize_rows

JFK = DEVSET_DIR / "real_jfk.wav"


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).norm() / b.norm()).detach())


@pytest.mark.parametrize(("shape", "bound"), [
    ((2048, 384, 1536), 0.02), ((7, 384, 384), 0.02), ((33, 383, 129), 0.02),
    ((1, 5, 3), 0.06),  # 5 terms: rounding errors barely average out
])
def test_int8_linear_is_close_to_float(shape: tuple[int, int, int], bound: float) -> None:
    rows, k, n = shape
    torch.manual_seed(0)
    linear = nn.Linear(k, n)
    x = torch.randn(rows, k)
    relative = _rel_err(Int8Linear.from_linear(linear)(x), linear(x))
    assert relative < bound, f"{shape}: relative error {relative:.4f}"
    assert relative > 0.0  # it really is quantized


def test_int8_linear_equals_its_integer_arithmetic() -> None:
    """The output is exactly (q_x @ q_w) * s_x * s_w + b, on padded and odd shapes alike."""
    torch.manual_seed(1)
    linear = nn.Linear(13, 11)
    layer = Int8Linear.from_linear(linear)
    assert layer.weight_t.shape == (16, 16)  # padded to multiples of 8 with zeros
    assert not layer.weight_t[13:].any() and not layer.weight_t[:, 11:].any()
    x = torch.randn(3, 13)  # 3 rows: padded to 17 for the int matmul
    qx, sx = quantize_rows(x)
    qw = layer.weight_t[:13, :11].int()
    expected = (qx.int() @ qw).float() * sx * layer.weight_scale + linear.bias.detach()
    torch.testing.assert_close(layer(x), expected, rtol=1e-6, atol=1e-6)
    dequantized = layer.dequantized_weight()
    assert _rel_err(dequantized, linear.weight.detach()) < 0.01


def test_int8_linear_keeps_leading_dims_rows_independent_and_zero_rows() -> None:
    torch.manual_seed(2)
    layer = Int8Linear.from_linear(nn.Linear(24, 40, bias=False))
    x = torch.randn(4, 5, 24)
    x[1, 2] = 0.0  # an all-zero row: scale floor, no NaN
    out = layer(x)
    assert out.shape == (4, 5, 40)
    assert torch.isfinite(out).all() and not out[1, 2].any()
    # per-row quantization: a row's output does not depend on the rest of the batch
    torch.testing.assert_close(layer(x[2:3, 1:2]), out[2:3, 1:2], rtol=0, atol=0)
    assert layer(torch.zeros(0, 24)).shape == (0, 40)
    with pytest.raises(ValueError, match="expects 24 input features, got 23"):
        layer(torch.randn(2, 23))


def test_quantize_linears_swaps_nested_layers_and_honours_skip() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 4)),
                          nn.Conv1d(8, 8, 1))
    names = quantize_linears(model, skip=lambda name, _: name == "1.1")
    assert names == ["0"]
    assert isinstance(model[0], Int8Linear) and type(model[1][1]) is nn.Linear
    assert count_int8_linears(model) == 1
    assert isinstance(model[2], nn.Conv1d)


def _stream_log_probs(model: nn.Module, dtype: str, samples: np.ndarray) -> torch.Tensor:
    """One stream through the engine's runner (features, windows, paged batched forward),
    chunk by chunk -> (T', V) log-probs."""
    config = EngineConfig(device="cpu", dtype=dtype, max_batch_size=1, max_num_blocks=128,
                          max_blocks_per_seq=128, endpoint=None, lm="none")
    resources = StreamResources.build(config, model)
    family, runner = resources.family, resources.runner
    assert (count_int8_linears(family.model) > 0) == (dtype == "int8")
    features = family.new_features()
    features.accept_waveform(samples)
    features.input_finished()
    windower = ChunkWindower(family.chunk_geometry(resources.chunk_size))
    resources.open_stream(0)
    outs, offset = [], 0
    while (window := windower.pop_window(features)) is not None:
        plan = BatchPlan([0], [0], [window], [offset])
        runner.prepare(plan)
        out = runner.forward(plan)
        runner.commit(plan)
        outs.append(out.log_probs[0, : out.lengths[0]])
        offset += out.lengths[0]
    return torch.cat(outs)


def _argmax_agreement(model: nn.Module, samples: np.ndarray) -> float:
    reference = _stream_log_probs(model, "float32", samples).argmax(-1)
    quantized = _stream_log_probs(model, "int8", samples).argmax(-1)
    assert quantized.shape == reference.shape
    return float((quantized == reference).float().mean())


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return read_audio(JFK)


def test_bundled_whisper_ctc_streams_in_int8_like_float(jfk: np.ndarray) -> None:
    from oasr.models import load_model
    from oasr.models.whisper_ctc import WhisperCtcModel

    model = load_model(None)
    if not isinstance(model, WhisperCtcModel):
        pytest.skip("the bundled model is not a Whisper-CTC model")
    before = copy.deepcopy(model.state_dict())
    agreement = _argmax_agreement(model, jfk)
    assert agreement >= 0.95, f"int8 agrees with float on {agreement:.1%} of frames"
    # the engine quantized a copy: the caller's model is unchanged
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_conformer_streams_in_int8_like_float(wenet_model: AsrModel, jfk: np.ndarray) -> None:
    agreement = _argmax_agreement(wenet_model, jfk)
    assert agreement >= 0.95, f"int8 agrees with float on {agreement:.1%} of frames"
