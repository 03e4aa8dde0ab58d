"""ConformerConfig: the frozen description of a streaming Conformer-CTC model.

Field names follow WeNet's ``encoder_conf`` keys so a WeNet ``train.yaml`` maps onto this
dataclass one to one; ``input_dim`` and ``vocab_size`` come from its top level.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SUPPORTED_INPUT_LAYERS = ("conv2d",)
SUPPORTED_POS_ENC = ("rel_pos",)
SUPPORTED_ATTENTION = ("rel_selfattn",)
SUPPORTED_ACTIVATIONS = ("swish", "relu", "gelu", "tanh")
SUPPORTED_CONV_NORMS = ("layer_norm", "batch_norm")

SUBSAMPLING_RATE = 4
SUBSAMPLING_RIGHT_CONTEXT = 6


@dataclass(frozen=True)
class ConformerConfig:
    """Architecture of a Conformer encoder with a CTC head (WeNet ``encoder_conf`` names).

    Invariant: every value here is checked in ``__post_init__``; a config that exists can build
    a model. Streaming geometry helpers (``chunk_window_frames``, ``chunk_stride_frames``) are
    derived, never stored.
    """

    input_dim: int = 80
    vocab_size: int = 32
    output_size: int = 256
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 12
    dropout_rate: float = 0.1
    positional_dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    input_layer: str = "conv2d"
    pos_enc_layer_type: str = "rel_pos"
    selfattention_layer_type: str = "rel_selfattn"
    normalize_before: bool = True
    static_chunk_size: int = 0
    use_dynamic_chunk: bool = False
    use_dynamic_left_chunk: bool = False
    macaron_style: bool = True
    activation_type: str = "swish"
    use_cnn_module: bool = True
    cnn_module_kernel: int = 15
    causal: bool = True
    cnn_module_norm: str = "layer_norm"
    query_bias: bool = True
    key_bias: bool = True
    value_bias: bool = True
    conv_bias: bool = True
    norm_eps: float = 1e-5
    conv_norm_eps: float = 1e-5
    use_global_cmvn: bool = True
    ctc_blank_id: int = 0

    def __post_init__(self) -> None:
        _check_choice("input_layer", self.input_layer, SUPPORTED_INPUT_LAYERS)
        _check_choice("pos_enc_layer_type", self.pos_enc_layer_type, SUPPORTED_POS_ENC)
        _check_choice(
            "selfattention_layer_type", self.selfattention_layer_type, SUPPORTED_ATTENTION
        )
        _check_choice("activation_type", self.activation_type, SUPPORTED_ACTIVATIONS)
        _check_choice("cnn_module_norm", self.cnn_module_norm, SUPPORTED_CONV_NORMS)
        for name in ("input_dim", "vocab_size", "output_size", "attention_heads",
                     "linear_units", "num_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"ConformerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.output_size % self.attention_heads != 0:
            raise ValueError(
                f"output_size {self.output_size} is not divisible by attention_heads "
                f"{self.attention_heads}; pick a head count that divides it"
            )
        if self.input_dim < 7:
            raise ValueError(f"input_dim {self.input_dim} is too small for conv2d subsampling (>= 7)")
        if self.cnn_module_kernel < 1 or (not self.causal and self.cnn_module_kernel % 2 == 0):
            raise ValueError(
                f"cnn_module_kernel {self.cnn_module_kernel} must be >= 1 (and odd when causal is false)"
            )
        if self.static_chunk_size < 0:
            raise ValueError(f"static_chunk_size must be >= 0, got {self.static_chunk_size}")
        if not 0 <= self.ctc_blank_id < self.vocab_size:
            raise ValueError(
                f"ctc_blank_id {self.ctc_blank_id} outside the vocabulary [0, {self.vocab_size})"
            )

    @property
    def head_dim(self) -> int:
        """d_k: per-head width of queries, keys and values."""
        return self.output_size // self.attention_heads

    @property
    def subsampling_rate(self) -> int:
        return SUBSAMPLING_RATE

    @property
    def cnn_cache_frames(self) -> int:
        """Left-context frames the causal depthwise conv keeps per layer (kernel - 1)."""
        return self.cnn_module_kernel - 1 if self.causal else 0

    def chunk_window_frames(self, chunk_size: int) -> int:
        """Fbank frames one streaming chunk of ``chunk_size`` encoder frames consumes."""
        return (chunk_size - 1) * SUBSAMPLING_RATE + SUBSAMPLING_RIGHT_CONTEXT + 1

    def chunk_stride_frames(self, chunk_size: int) -> int:
        """Fbank frames between the starts of consecutive chunk windows."""
        return chunk_size * SUBSAMPLING_RATE

    def is_streamable(self) -> bool:
        """True when chunk-by-chunk inference equals the chunk-masked full forward."""
        return self.causal or not self.use_cnn_module

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConformerConfig:
        """Build from a dict with exactly this dataclass's keys (unknown keys are an error)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown ConformerConfig keys {unknown}; known keys: {sorted(names)}")
        return cls(**data)


def _check_choice(name: str, value: str, supported: tuple[str, ...]) -> None:
    if value not in supported:
        raise ValueError(f"{name}={value!r} is not supported; supported: {list(supported)}")
