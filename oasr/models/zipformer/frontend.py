"""Zipformer2's front end (icefall ``Conv2dSubsampling``): 100 Hz fbank -> 50 Hz embeddings.

Three Conv2d with SwooshR (time: 3 taps, 3 taps stride 2, 3 taps; T' = (T - 7) // 2), a ConvNeXt
block (7x7 depthwise, 1x1 to 3x channels, SwooshL, 1x1 back, residual), flatten
(channel * width + freq), Linear, BiasNorm. In streaming the Conv2d stack runs on each window
from scratch (the windows overlap by 13 fbank frames) and only the ConvNeXt keeps a cache: its
3 frames of left context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from oasr.models.zipformer.layers import BiasNorm, swoosh_l, swoosh_r

LAYER3_CHANNELS = 128
CONVNEXT_KERNEL = 7
CONVNEXT_CONTEXT = CONVNEXT_KERNEL // 2  # 3 frames each side (50 Hz)


def front_end_width(feature_dim: int) -> int:
    """Frequency bins left after the two frequency-strided convs (19 for 80 bins)."""
    return ((feature_dim - 1) // 2 - 1) // 2


class ConvNeXt(nn.Module):
    """x + pointwise_conv2(SwooshL(pointwise_conv1(depthwise_conv(x)))), on (B, C, T, F)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        pad = CONVNEXT_CONTEXT
        self.depthwise_conv = nn.Conv2d(channels, channels, CONVNEXT_KERNEL, groups=channels,
                                        padding=(pad, pad))
        self.pointwise_conv1 = nn.Conv2d(channels, 3 * channels, 1)
        self.pointwise_conv2 = nn.Conv2d(3 * channels, channels, 1)

    def _mlp(self, x: Tensor) -> Tensor:
        return self.pointwise_conv2(swoosh_l(self.pointwise_conv1(x)))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C, T, F), zero time padding at both ends -> (B, C, T, F)."""
        return x + self._mlp(self.depthwise_conv(x))

    def streaming_forward(self, x: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, C, T + 3, F) a window whose last 3 frames are right context only;
        cache: (B, C, 3, F) the 3 frames before it.

        Returns:
            (B, C, T, F) and the new cache: x's frames T - 3 .. T - 1 (the last 3 frames the
            output covers; the next window starts right after them).
        """
        T = x.shape[2] - CONVNEXT_CONTEXT
        full = torch.cat([cache, x], dim=2)  # (B, C, 3 + T + 3, F)
        new_cache = full[:, :, T : T + CONVNEXT_CONTEXT]  # (B, C, 3, F)
        conv = self.depthwise_conv
        h = F.conv2d(full, conv.weight, conv.bias, padding=(0, CONVNEXT_CONTEXT),
                     groups=conv.groups)  # (B, C, T, F)
        return x[:, :, :T] + self._mlp(h), new_cache


class Conv2dSubsampling(nn.Module):
    """(B, T, feature_dim) fbank -> (B, (T - 7) // 2, dim) embeddings."""

    def __init__(self, feature_dim: int, dim: int) -> None:
        super().__init__()
        if feature_dim < 7:
            raise ValueError(f"feature_dim must be >= 7, got {feature_dim}")
        self.conv1 = nn.Conv2d(1, 8, 3, padding=(0, 1))
        self.conv2 = nn.Conv2d(8, 32, 3, stride=2)
        self.conv3 = nn.Conv2d(32, LAYER3_CHANNELS, 3, stride=(1, 2))
        self.convnext = ConvNeXt(LAYER3_CHANNELS)
        self.width = front_end_width(feature_dim)
        self.out = nn.Linear(LAYER3_CHANNELS * self.width, dim)
        self.out_norm = BiasNorm(dim)

    def _convs(self, x: Tensor) -> Tensor:
        x = swoosh_r(self.conv1(x.unsqueeze(1)))  # (B, 8, T - 2, F)
        x = swoosh_r(self.conv2(x))  # (B, 32, (T - 3) // 2, (F - 1) // 2)
        return swoosh_r(self.conv3(x))  # (B, 128, (T - 7) // 2, width)

    def _project(self, x: Tensor) -> Tensor:
        B, C, T, W = x.shape
        x = x.transpose(1, 2).reshape(B, T, C * W)  # (B, T, 128 * width)
        return self.out_norm(self.out(x))  # (B, T, dim)

    def forward(self, feats: Tensor, lens: Tensor) -> tuple[Tensor, Tensor]:
        """feats: (B, T, F); lens: (B,) -> (B, (T - 7) // 2, dim), (B,) lengths."""
        return self._project(self.convnext(self._convs(feats))), (lens - 7) // 2

    def init_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> Tensor:
        """The ConvNeXt's zero cache of ``batch`` streams: (B, 128, 3, width)."""
        channels = self.convnext.depthwise_conv.in_channels
        return torch.zeros(batch, channels, CONVNEXT_CONTEXT, self.width, device=device,
                           dtype=dtype)

    def streaming_forward(self, window: Tensor, lens: Tensor,
                          cache: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One window of 2 * chunk + 13 fbank frames.

        Args:
            window: (B, T, F); lens: (B,) valid frames; cache: (B, 128, 3, width).
        Returns:
            (B, (T - 7) // 2 - 3, dim), lengths (lens - 7) // 2 - 3, the new cache.
        """
        x, cache = self.convnext.streaming_forward(self._convs(window), cache)
        return self._project(x), (lens - 7) // 2 - CONVNEXT_CONTEXT, cache
