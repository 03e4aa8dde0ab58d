"""The fused CPU linears equal the plain ops: bias, GELU and residual inside one oneDNN call,
a conv stem laid out as a Linear, the packed-weight cache following the weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from oasr.models import fused_linear
from oasr.models.fused_linear import conv_weight_as_linear, fusable, linear, linear_weights
from oasr.models.int8 import Int8Linear

needs_bf16 = pytest.mark.skipif(
    not fusable(torch.zeros(1, dtype=torch.bfloat16)),
    reason="this CPU does not multiply bfloat16 natively (no fused path to test)")


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gelu: bool,
               residual: torch.Tensor | None) -> torch.Tensor:
    """The same maths in float32 from the same bfloat16 operands."""
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    y = F.gelu(y) if gelu else y
    return y if residual is None else residual.float() + y


@needs_bf16
@pytest.mark.parametrize(("gelu", "with_residual", "with_bias"),
                         [(False, False, True), (True, False, True), (False, True, True),
                          (False, False, False), (True, False, False)])
def test_fused_equals_float32_maths(gelu: bool, with_residual: bool, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 48, generator=g).bfloat16()
    weight = (torch.randn(24, 48, generator=g) * 0.2).bfloat16()
    bias = torch.randn(24, generator=g).bfloat16() if with_bias else None
    residual = torch.randn(37, 24, generator=g).bfloat16() if with_residual else None
    got = linear_weights(x, weight, bias, gelu=gelu, residual=residual)
    want = _reference(x, weight, bias, gelu, residual)
    assert got.dtype == torch.bfloat16 and got.shape == (37, 24)
    # one bfloat16 rounding of the result (2^-8 relative) and the accumulation order
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=1e-2)
    # and a wrong fusion would not pass: the residual or the GELU left out differs by far more
    if with_residual:
        assert (got.float() - _reference(x, weight, bias, gelu, None)).abs().max() > 0.5
    if gelu:
        assert (got.float() - _reference(x, weight, bias, False, None)).abs().max() > 0.5


@needs_bf16
def test_packed_weight_follows_in_place_updates() -> None:
    layer = nn.Linear(16, 8).bfloat16()
    x = torch.randn(5, 16).bfloat16()
    before = linear(x, layer)
    packed = fused_linear.packed_weight(layer.weight)
    assert fused_linear.packed_weight(layer.weight) is packed  # cached while unchanged
    with torch.no_grad():
        layer.weight.mul_(-1.0)
    after = linear(x, layer)
    assert fused_linear.packed_weight(layer.weight) is not packed
    torch.testing.assert_close(after.float(), _reference(x, layer.weight, layer.bias, False, None),
                               atol=2e-2, rtol=1e-2)
    assert not torch.allclose(before, after)


@needs_bf16
def test_packed_weights_are_dropped_with_their_layer() -> None:
    layer = nn.Linear(16, 8).bfloat16()
    linear(torch.randn(3, 16).bfloat16(), layer)
    slot = id(layer.weight)
    assert slot in fused_linear._PACKED
    del layer
    assert slot not in fused_linear._PACKED


def test_leading_dims_and_plain_fallbacks() -> None:
    """Any leading dims; float32 and non-Linear layers (an Int8Linear) take the plain ops."""
    g = torch.Generator().manual_seed(1)
    layer = nn.Linear(12, 6)
    x, res = torch.randn(2, 3, 12, generator=g), torch.randn(2, 3, 6, generator=g)
    torch.testing.assert_close(linear(x, layer, residual=res), res + layer(x))
    torch.testing.assert_close(linear(x, layer, gelu=True), F.gelu(layer(x)))
    q = Int8Linear.from_linear(layer)
    torch.testing.assert_close(linear(x, q, residual=res), res + q(x))
    with pytest.raises(ValueError, match="not both"):
        linear_weights(x[0], layer.weight, layer.bias, gelu=True, residual=res[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_as_linear_equals_conv1d(dtype: torch.dtype, stride: int) -> None:
    """The tap-major kernel over unfolded windows is the conv: the layout a wrong permute of
    the kernel (channel-major) would break."""
    torch.manual_seed(2)
    conv = nn.Conv1d(10, 7, 3, stride=stride).to(dtype)
    frames = torch.randn(3, 11, 10).to(dtype)  # (B, T, C_in), channel-last
    want = F.gelu(conv(frames.transpose(1, 2).float() if dtype == torch.float32
                       else frames.transpose(1, 2))).transpose(1, 2)
    outputs = (11 - 3) // stride + 1
    windows = frames.unfold(1, 3, stride).transpose(2, 3).reshape(3 * outputs, 30)
    got = linear_weights(windows, conv_weight_as_linear(conv), conv.bias, gelu=True)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(got.view(3, outputs, 7).float(), want.float(), **tol)
    assert conv_weight_as_linear(conv) is conv_weight_as_linear(conv)


@needs_bf16
def test_prepack_packs_every_weight_the_chunk_step_multiplies_by() -> None:
    """After `prepack` a bfloat16 chunk step reorders no weight (the first live chunk does not
    pay for it); float32 packs nothing."""
    from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel
    from oasr.models.whisper_ctc.streaming import prepack

    config = WhisperCtcConfig(n_mels=8, width=16, heads=2, layers=2, max_positions=64,
                              vocab_size=30, chunk_frames=4)
    model = WhisperCtcModel(config).eval()
    assert prepack(model) == 0
    model = model.bfloat16()
    assert prepack(model) == 4 * config.layers + 2
    before = {slot: entry[2] for slot, entry in fused_linear._PACKED.items()}
    assert prepack(model) == 4 * config.layers + 2
    assert all(fused_linear._PACKED[slot][2] is packed for slot, packed in before.items())
    # what the chunk step will look up is what was packed
    for weight in [model.blocks[0].qkv.weight, model.blocks[1].ffn.down.weight,
                   conv_weight_as_linear(model.conv1), conv_weight_as_linear(model.conv2)]:
        assert id(weight) in before
