"""The Whisper-encoder CTC model: Whisper's conv stem and Transformer blocks made chunk-causal,
with a linear CTC head over oasr's character units.

Causality: both convs are left-padded (2 zero frames each) instead of centred, and
self-attention uses a chunk mask, so an encoder frame never depends on audio after the end of
its chunk. The same weights therefore stream chunk by chunk (``streaming.py``) with the result of
``forward`` on the whole utterance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oasr.cache.state_spec import StreamStateSpec
from oasr.models.whisper.model import EncoderBlock
from oasr.models.whisper_ctc.config import WhisperCtcConfig

CONV_CONTEXT = 2  # left frames each conv needs (kernel 3, no right context)
CONV1_STATE = "conv1"
CONV2_STATE = "conv2"


def whisper_ctc_state_specs(config: WhisperCtcConfig) -> tuple[StreamStateSpec, ...]:
    """The conv stem's fixed-extent per-stream state: conv1's and conv2's left context,
    (2, n_mels) and (2, width) per stream, the stream on axis 0."""
    return (
        StreamStateSpec(CONV1_STATE, (CONV_CONTEXT, config.n_mels), slot_axis=0),
        StreamStateSpec(CONV2_STATE, (CONV_CONTEXT, config.width), slot_axis=0),
    )


class WhisperCtcBlock(EncoderBlock):
    """Whisper's encoder block (pre-norm fused-QKV self-attention, then feed-forward; the same
    parameter names); ``forward(x, mask)`` takes the chunk-causal mask (B, 1, T, T)."""


def chunk_mask(lengths: torch.Tensor, frames: int, chunk_frames: int,
               left_chunks: int = -1) -> torch.Tensor:
    """The chunk-causal attention mask.

    Frame t may attend to frame s iff s < its row's length, chunk(s) <= chunk(t) and
    (left_chunks < 0 or chunk(s) >= chunk(t) - left_chunks), chunk(x) = x // chunk_frames;
    chunk_frames <= 0 means full context. Every frame may also attend to itself, so padded
    frames (whose outputs are ignored) never see an empty row.

    Args:
        lengths: (B,) valid encoder frames per row.
        frames: T, the padded encoder length.
    Returns:
        (B, 1, T, T) bool.
    """
    pos = torch.arange(frames, device=lengths.device)
    valid = pos[None, None, :] < lengths[:, None, None]  # (B, 1, T) over s
    if chunk_frames > 0:
        chunk = pos // chunk_frames
        allowed = chunk[None, :] <= chunk[:, None]  # (T, T): [t, s]
        if left_chunks >= 0:
            allowed &= chunk[None, :] >= chunk[:, None] - left_chunks
    else:
        allowed = torch.ones(frames, frames, dtype=torch.bool, device=lengths.device)
    mask = allowed[None] & valid  # (B, T, T)
    mask |= torch.eye(frames, dtype=torch.bool, device=lengths.device)[None]
    return mask[:, None]


class WhisperCtcModel(nn.Module):
    """Chunk-causal Whisper encoder + CTC head. Holds no stream state.

    Attributes (the streaming path reads them): ``conv1``, ``conv2`` (causal, no built-in
    padding), ``positions`` (max_positions, width), ``blocks``, ``norm``, ``ctc``, ``config``;
    ``units`` (one string per CTC output) once loaded from a model dir.
    """

    units: tuple[str, ...]

    def __init__(self, config: WhisperCtcConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or WhisperCtcConfig()
        self.conv1 = nn.Conv1d(config.n_mels, config.width, 3)
        self.conv2 = nn.Conv1d(config.width, config.width, 3, stride=2)
        self.positions: torch.Tensor
        self.register_buffer("positions", torch.zeros(config.max_positions, config.width))
        self.blocks = nn.ModuleList(
            WhisperCtcBlock(config.width, config.heads) for _ in range(config.layers)
        )
        self.norm = nn.LayerNorm(config.width)
        self.ctc = nn.Linear(config.width, config.vocab_size)

    @property
    def streaming_state_specs(self) -> tuple[StreamStateSpec, ...]:
        """The state the chunk forward reads by name
        (`oasr.models.whisper_ctc.streaming.forward_chunk_states`): the conv-stem tails."""
        return whisper_ctc_state_specs(self.config)

    def conv_stem(self, mel: torch.Tensor) -> torch.Tensor:
        """(B, T, n_mels) log-mel, T even -> (B, T // 2, width) with zero left context."""
        x = F.pad(mel.transpose(1, 2), (CONV_CONTEXT, 0))  # (B, n_mels, T + 2)
        x = F.gelu(self.conv1(x))  # (B, d, T)
        x = F.gelu(self.conv2(F.pad(x, (CONV_CONTEXT, 0))))  # (B, d, T // 2)
        return x.transpose(1, 2)

    def forward(self, mel: torch.Tensor, mel_lengths: torch.Tensor, chunk_frames: int,
                left_chunks: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole utterances under the chunk-causal mask.

        Args:
            mel: (B, T, n_mels) causal log-mel (an odd trailing frame is dropped).
            mel_lengths: (B,) valid mel frames per row.
            chunk_frames: encoder frames per chunk; <= 0 is full context.
            left_chunks: chunks of history each chunk sees; < 0 is all.
        Returns:
            log_probs (B, T // 2, V) float32 and out_lengths (B,) = mel_lengths // 2.
        Raises:
            ValueError: T // 2 exceeds ``max_positions``.
        """
        x, out_lengths = self.embed(mel, mel_lengths)
        mask = chunk_mask(out_lengths.to(x.device), x.size(1), chunk_frames, left_chunks)
        for block in self.blocks:
            x = block(x, mask)
        return self.ctc_log_probs(x), out_lengths

    def embed(self, mel: torch.Tensor, mel_lengths: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first block's input: conv stem + positions (B, T // 2, width), and the encoder
        lengths (B,) = mel_lengths // 2; raises ValueError past ``max_positions``."""
        frames = mel.size(1) // 2
        if frames > self.config.max_positions:
            raise ValueError(
                f"{mel.size(1)} mel frames give {frames} encoder frames; the model has "
                f"{self.config.max_positions} positions ({self.config.max_positions * self.config.frame_shift_s:.0f} s):"
                " split or reset the stream"
            )
        x = self.conv_stem(mel[:, : 2 * frames].to(self.conv1.weight.dtype))  # (B, T', d)
        x = x + self.positions[:frames].to(x.dtype)
        return x, torch.div(mel_lengths, 2, rounding_mode="floor").to(torch.int64)

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Last block's output (B, T', width) -> CTC log-probabilities (B, T', V) float32."""
        return F.log_softmax(self.ctc(self.norm(hidden)).float(), dim=-1)
