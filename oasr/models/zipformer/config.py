"""ZipformerConfig: the geometry of an icefall Zipformer2 (``train.py``'s model arguments)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

# per-stack arguments: a comma list with one value per stack, or one value for every stack
PER_STACK = ("num_encoder_layers", "downsampling_factor", "encoder_dim", "feedforward_dim",
             "num_heads", "query_head_dim", "value_head_dim", "pos_head_dim",
             "cnn_module_kernel")
# encoder_unmasked_dim (training-time feature masking) does not change inference: not kept
# icefall train.py's defaults (egs/librispeech/ASR/zipformer), used for what an experiment
# directory does not state and the checkpoint's shapes cannot tell
ICEFALL_DEFAULTS: dict[str, Any] = {
    "num_encoder_layers": "2,2,3,4,3,2", "downsampling_factor": "1,2,4,8,4,2",
    "feedforward_dim": "512,768,1024,1536,1024,768", "num_heads": "4,4,4,8,4,4",
    "encoder_dim": "192,256,384,512,384,256", "query_head_dim": "32", "value_head_dim": "12",
    "pos_head_dim": "4", "pos_dim": 48,
    "cnn_module_kernel": "31,31,15,15,15,31", "decoder_dim": 512, "joiner_dim": 512,
    "causal": False, "chunk_size": "16,32,64,-1", "left_context_frames": "64,128,256,-1",
    "context_size": 2, "vocab_size": 500, "blank_id": 0, "feature_dim": 80,
    "use_transducer": True, "use_ctc": False,
}


def per_stack(value: Any, num_stacks: int, name: str) -> tuple[int, ...]:
    """icefall's ``_to_tuple``: "1,2,4" -> (1, 2, 4); "8" or 8 -> (8,) * num_stacks.

    Raises:
        ValueError: a list of the wrong length or a non-integer entry.
    """
    if isinstance(value, (list, tuple)):
        items = [int(v) for v in value]
    else:
        try:
            items = [int(v) for v in str(value).split(",")]
        except ValueError:
            raise ValueError(f"{name}: expected integers separated by commas, got {value!r}") from None
    if len(items) == 1:
        items = items * num_stacks
    if len(items) != num_stacks:
        raise ValueError(f"{name} has {len(items)} values, expected one per stack "
                         f"({num_stacks} stacks, from downsampling_factor) or a single value")
    return tuple(items)


@dataclass(frozen=True)
class ZipformerConfig:
    """A causal Zipformer2 transducer / CTC model, one decode-time chunk setting.

    Attributes:
        (per-stack tuples) as icefall's train.py arguments of the same names.
        chunk_size: decode chunk in 50 Hz frames (after the front end); -1 = full context.
        left_context_frames: attention left context in 50 Hz frames; -1 = unlimited (only with
            chunk_size -1: a streaming cache needs a fixed extent).
    """

    num_encoder_layers: tuple[int, ...]
    downsampling_factor: tuple[int, ...]
    encoder_dim: tuple[int, ...]
    feedforward_dim: tuple[int, ...]
    num_heads: tuple[int, ...]
    query_head_dim: tuple[int, ...]
    value_head_dim: tuple[int, ...]
    pos_head_dim: tuple[int, ...]
    cnn_module_kernel: tuple[int, ...]
    pos_dim: int = 48
    feature_dim: int = 80
    decoder_dim: int = 512
    joiner_dim: int = 512
    context_size: int = 2
    vocab_size: int = 500
    blank_id: int = 0
    use_transducer: bool = True
    use_ctc: bool = False
    causal: bool = True
    chunk_size: int = 16
    left_context_frames: int = 64

    def __post_init__(self) -> None:
        n = len(self.downsampling_factor)
        for name in PER_STACK:
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} values for {n} stacks")
        if not (self.use_transducer or self.use_ctc):
            raise ValueError("the model has neither a transducer nor a CTC head "
                             "(use_transducer and use_ctc are both false)")
        if self.chunk_size == 0 or self.chunk_size < -1:
            raise ValueError(f"chunk_size must be -1 (full context) or positive, got {self.chunk_size}")
        if self.chunk_size > 0:
            self._check_streaming()

    def _check_streaming(self) -> None:
        if not self.causal:
            raise ValueError("chunked decoding needs a causal model (train.py --causal 1); "
                             "load it with chunk_size=-1, left_context_frames=-1")
        bad = [d for d in self.downsampling_factor if self.chunk_size % d]
        if bad or self.chunk_size % 2:
            raise ValueError(f"chunk_size {self.chunk_size} must be a multiple of 2 and of every "
                             f"downsampling factor {self.downsampling_factor}")
        left = self.left_context_frames
        if left < 0 or any(left % d for d in self.downsampling_factor):
            raise ValueError(f"left_context_frames {left} must be >= 0 and a multiple of every "
                             f"downsampling factor {self.downsampling_factor} when streaming")
        for k, d in zip(self.cnn_module_kernel, self.downsampling_factor, strict=True):
            if left < (k // 2) * d:
                raise ValueError(f"left_context_frames {left} is shorter than a conv kernel's "
                                 f"reach ({k // 2} frames at downsampling {d})")

    @property
    def num_stacks(self) -> int:
        return len(self.downsampling_factor)

    @property
    def output_dim(self) -> int:
        """Channels of the encoder output: the widest stack."""
        return max(self.encoder_dim)

    @property
    def is_streaming(self) -> bool:
        return self.chunk_size > 0

    @property
    def window_frames(self) -> int:
        """Fbank frames a streaming step reads: 2 * chunk + 13 (7 for the Conv2d stack, 6 for
        the ConvNeXt's 3 frames of right context at 50 Hz)."""
        return 2 * self.chunk_size + 13

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_train_args(cls, args: dict[str, Any], chunk_size: int,
                        left_context_frames: int) -> ZipformerConfig:
        """From icefall ``train.py`` argument names and values (missing ones: icefall's defaults).

        Raises:
            ValueError: a malformed value.
        """
        merged = {**ICEFALL_DEFAULTS, **args}
        ds = merged["downsampling_factor"]
        n = len(ds) if isinstance(ds, (list, tuple)) else len(str(ds).split(","))
        kw: dict[str, Any] = {name: per_stack(merged[name], n, name) for name in PER_STACK}
        ints = ("pos_dim", "feature_dim", "decoder_dim", "joiner_dim", "context_size",
                "vocab_size", "blank_id")
        kw.update({k: int(merged[k]) for k in ints})
        kw.update({k: _as_bool(merged[k], k) for k in ("use_transducer", "use_ctc", "causal")})
        known = {f.name for f in fields(cls)}
        assert set(kw) | {"chunk_size", "left_context_frames"} == known
        return cls(**kw, chunk_size=chunk_size, left_context_frames=left_context_frames)


def _as_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ValueError(f"{name}: expected a boolean, got {value!r}")
