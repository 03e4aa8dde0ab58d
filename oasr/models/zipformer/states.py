"""A streaming Zipformer's per-stream state, declared: one `StreamStateSpec` per tensor.

Names: ``layer{n}.{cached_key | cached_nonlin_attn | cached_val1 | cached_val2 | cached_conv1 |
cached_conv2}`` for encoder layer n (counted across stacks, in order), ``embed_left_pad`` (the
ConvNeXt's 3 cached frames) and ``processed_lens`` (50 Hz frames seen since the start, int32).
Each tensor keeps icefall's layout, the stream on icefall's batch axis (the spec's
``slot_axis``), so a gathered batch is exactly the tensor icefall's ``streaming_forward`` takes,
and the spec order is icefall's flat state list order (``get_init_states``) - the one place
that order is used. The specs are derived from the modules' own zero states
(`streaming_init_states`, run on the meta device), so their order, shapes and batch axes
cannot drift from what the model reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from oasr.cache.state_spec import StreamStateSpec
from oasr.models.zipformer.config import ZipformerConfig
from oasr.models.zipformer.encoder import LAYER_STATE_NAMES, LayerState, ZipformerEncoder
from oasr.models.zipformer.frontend import Conv2dSubsampling

EMBED_STATE = "embed_left_pad"
PROCESSED_STATE = "processed_lens"


def layer_state_name(layer: int, name: str) -> str:
    return f"layer{layer}.{name}"


def streaming_init_states(encoder: ZipformerEncoder, embed: Conv2dSubsampling, batch_size: int,
                          device: torch.device | str, dtype: torch.dtype) -> dict[str, Tensor]:
    """The zero state of ``batch_size`` streams by name, in icefall's state-list order, each
    tensor shaped by the module that reads it (the encoder layers' caches, the ConvNeXt's) and
    ``processed_lens`` (int32): icefall's ``get_init_states``, named."""
    named = named_layer_states(encoder.get_streaming_init_states(batch_size, device, dtype))
    named[EMBED_STATE] = embed.init_state(batch_size, device, dtype)
    named[PROCESSED_STATE] = torch.zeros(batch_size, dtype=torch.int32, device=device)
    return named


def specs_from_init_states(init: Callable[[int], Mapping[str, Tensor]]) -> list[StreamStateSpec]:
    """The specs of the states ``init(batch_size)`` makes, in its order: it is run for 1 and 2
    streams (on the meta device, so nothing is allocated), the one axis whose size follows the
    batch is the spec's slot axis, the rest its shape; a floating state takes the cache's
    dtype, any other keeps its own.

    Raises:
        ValueError: a state whose shapes for 1 and 2 streams differ in anything but one axis
            of size 1 and 2.
    """
    one, two = init(1), init(2)
    specs = []
    for name, first in one.items():
        a, b = tuple(first.shape), tuple(two[name].shape)
        axes = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
        if len(a) != len(b) or len(axes) != 1 or (a[axes[0]], b[axes[0]]) != (1, 2):
            raise ValueError(f"state {name!r} is {a} for one stream and {b} for two: no single "
                             "axis follows the batch")
        axis = axes[0]
        dtype = None if first.dtype.is_floating_point else first.dtype
        specs.append(StreamStateSpec(name, a[:axis] + a[axis + 1 :], axis, dtype=dtype))
    return specs


def zipformer_state_specs(cfg: ZipformerConfig) -> list[StreamStateSpec]:
    """Every per-stream tensor of a streaming model of ``cfg``, in icefall's state-list order:
    `specs_from_init_states` of the init states of its modules, built on the meta device.

    Raises:
        ValueError: the config is a full-context one (no fixed-extent cache).
    """
    if not cfg.is_streaming:
        raise ValueError("a full-context Zipformer (chunk_size -1) has no streaming state: "
                         "load it with chunk_size > 0 to stream")
    with torch.device("meta"):
        encoder = ZipformerEncoder(cfg)
        embed = Conv2dSubsampling(cfg.feature_dim, cfg.encoder_dim[0])
    return specs_from_init_states(
        lambda batch: streaming_init_states(encoder, embed, batch, "meta", torch.float32))


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
