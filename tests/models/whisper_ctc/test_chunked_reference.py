"""The streaming contract, checked against a plain chunk loop written here: feeding 2 x
chunk_frames mel frames at a time, carrying the two conv left contexts and every layer's K/V,
gives ``forward(..., chunk_frames)`` on the whole stream (what ``streaming.py`` must match)."""

import pytest
import torch
import torch.nn.functional as F

from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel

TINY = WhisperCtcConfig(width=32, heads=2, layers=3, max_positions=300, chunk_frames=4)


@torch.no_grad()
def run_chunked(model: WhisperCtcModel, mel: torch.Tensor, chunk_frames: int) -> torch.Tensor:
    """mel (T, n_mels) -> log-probs (T // 2, V), one chunk at a time."""
    width = model.config.width
    mel_ctx = torch.zeros(2, mel.size(1))  # conv1's left context
    act_ctx = torch.zeros(2, width)  # conv2's left context (GELU(conv1) frames)
    keys: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    values: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    outputs, offset = [], 0
    usable = mel[: 2 * (mel.size(0) // 2)]
    for start in range(0, usable.size(0), 2 * chunk_frames):
        piece = torch.cat([mel_ctx, usable[start:start + 2 * chunk_frames]])  # (2 + 2C, n_mels)
        mel_ctx = piece[-2:]
        act = F.gelu(model.conv1(piece.T[None]))[0].T  # (2C, d)
        act = torch.cat([act_ctx, act])
        act_ctx = act[-2:]
        x = F.gelu(model.conv2(act.T[None]))[0].T  # (C, d)
        x = x + model.positions[offset:offset + x.size(0)]
        for i, block in enumerate(model.blocks):
            qkv = block.qkv(block.attn_norm(x)).view(x.size(0), 3, block.heads, -1)
            keys[i].append(qkv[:, 1])
            values[i].append(qkv[:, 2])
            k, v = torch.cat(keys[i]), torch.cat(values[i])  # (history + C, H, D)
            att = F.scaled_dot_product_attention(qkv[:, 0].transpose(0, 1), k.transpose(0, 1),
                                                 v.transpose(0, 1))  # (H, C, D)
            x = x + block.out(att.transpose(0, 1).reshape(x.size(0), width))
            x = x + block.ffn(x)
        outputs.append(model.ctc_log_probs(x))
        offset += x.size(0)
    return torch.cat(outputs)


@pytest.mark.parametrize(("frames", "chunk"), [(64, 4), (61, 4), (50, 8), (30, 16)])
def test_chunk_by_chunk_equals_the_masked_forward(frames: int, chunk: int) -> None:
    torch.manual_seed(0)
    model = WhisperCtcModel(TINY).eval()
    with torch.no_grad():
        model.positions.normal_()
    mel = torch.randn(frames, 80)
    whole, lens = model(mel[None], torch.tensor([frames]), chunk)
    chunked = run_chunked(model, mel, chunk)
    assert chunked.shape == whole[0].shape == (frames // 2, TINY.vocab_size)
    torch.testing.assert_close(chunked, whole[0], atol=1e-4, rtol=0)
