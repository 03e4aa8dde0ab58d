"""A streaming Zipformer's per-stream state, declared: one `StreamStateSpec` per tensor.

Names: ``layer{n}.{cached_key | cached_nonlin_attn | cached_val1 | cached_val2 | cached_conv1 |
cached_conv2}`` for encoder layer n (counted across stacks, in order), ``embed_left_pad`` (the
ConvNeXt's 3 cached frames) and ``processed_lens`` (50 Hz frames seen since the start, int32).
Each tensor keeps icefall's layout, the stream on icefall's batch axis (the spec's
``slot_axis``), so a gathered batch is exactly the tensor icefall's ``streaming_forward`` takes,
and the spec order is icefall's flat state list order (``get_init_states``) - the one place
that order is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from oasr.cache.state_spec import StreamStateSpec
from oasr.models.zipformer.config import ZipformerConfig
from oasr.models.zipformer.encoder import LAYER_STATE_NAMES, LayerState
from oasr.models.zipformer.frontend import CONVNEXT_CONTEXT, LAYER3_CHANNELS, front_end_width

EMBED_STATE = "embed_left_pad"
PROCESSED_STATE = "processed_lens"


def layer_state_name(layer: int, name: str) -> str:
    return f"layer{layer}.{name}"


def zipformer_state_specs(cfg: ZipformerConfig) -> list[StreamStateSpec]:
    """Every per-stream tensor of a streaming model, in icefall's state-list order.

    Raises:
        ValueError: the config is a full-context one (no fixed-extent cache).
    """
    if not cfg.is_streaming:
        raise ValueError("a full-context Zipformer (chunk_size -1) has no streaming state: "
                         "load it with chunk_size > 0 to stream")
    specs: list[StreamStateSpec] = []
    layer = 0
    for s in range(cfg.num_stacks):
        left = cfg.left_context_frames // cfg.downsampling_factor[s]
        dim = cfg.encoder_dim[s]
        key_dim = cfg.num_heads[s] * cfg.query_head_dim[s]
        value_dim = cfg.num_heads[s] * cfg.value_head_dim[s]
        conv = (dim, cfg.cnn_module_kernel[s] // 2)
        shapes = {  # icefall layout without its batch axis, and where that axis sits
            "cached_key": ((left, key_dim), 1),
            "cached_nonlin_attn": ((1, left, 3 * dim // 4), 1),
            "cached_val1": ((left, value_dim), 1),
            "cached_val2": ((left, value_dim), 1),
            "cached_conv1": (conv, 0),
            "cached_conv2": (conv, 0),
        }
        for _ in range(cfg.num_encoder_layers[s]):
            for name in LAYER_STATE_NAMES:
                shape, axis = shapes[name]
                specs.append(StreamStateSpec(layer_state_name(layer, name), shape, axis))
            layer += 1
    width = front_end_width(cfg.feature_dim)
    specs.append(StreamStateSpec(EMBED_STATE, (LAYER3_CHANNELS, CONVNEXT_CONTEXT, width)))
    specs.append(StreamStateSpec(PROCESSED_STATE, (), dtype=torch.int32))
    return specs


def init_states(specs: Sequence[StreamStateSpec], batch_size: int, device: torch.device | str,
                dtype: torch.dtype) -> dict[str, Tensor]:
    """Zeroed states for ``batch_size`` streams, by name."""
    return {s.name: torch.zeros(s.stored_shape(batch_size), dtype=s.dtype or dtype, device=device)
            for s in specs}


def layer_states(cfg: ZipformerConfig, states: Mapping[str, Tensor]) -> list[list[LayerState]]:
    """The named states grouped as [stack][layer] `LayerState`s.

    Raises:
        KeyError: a state is missing (named).
    """
    grouped, layer = [], 0
    for num_layers in cfg.num_encoder_layers:
        stack = []
        for _ in range(num_layers):
            stack.append(LayerState(*(_get(states, layer_state_name(layer, n))
                                      for n in LAYER_STATE_NAMES)))
            layer += 1
        grouped.append(stack)
    return grouped


def named_layer_states(grouped: Sequence[Sequence[LayerState]]) -> dict[str, Tensor]:
    """The inverse of `layer_states`."""
    out, layer = {}, 0
    for stack in grouped:
        for state in stack:
            for name, tensor in zip(LAYER_STATE_NAMES, state, strict=True):
                out[layer_state_name(layer, name)] = tensor
            layer += 1
    return out


def to_icefall_list(specs: Sequence[StreamStateSpec], states: Mapping[str, Tensor]) -> list[Tensor]:
    """Named states as icefall's flat list (its ``streaming_forward`` / ``get_init_states``)."""
    return [_get(states, s.name) for s in specs]


def from_icefall_list(specs: Sequence[StreamStateSpec], states: Sequence[Tensor]) -> dict[str, Tensor]:
    """icefall's flat state list as named states.

    Raises:
        ValueError: the list has the wrong length.
    """
    if len(states) != len(specs):
        raise ValueError(f"expected {len(specs)} state tensors (6 per encoder layer, the embed "
                         f"cache, processed_lens), got {len(states)}")
    return {s.name: t for s, t in zip(specs, states, strict=True)}


def _get(states: Mapping[str, Tensor], name: str) -> Tensor:
    try:
        return states[name]
    except KeyError:
        raise KeyError(f"streaming state {name!r} is missing") from None
