"""Whisper geometry and decoding constants, derived from a loaded checkpoint."""

from __future__ import annotations

from dataclasses import dataclass

_POSITIVE = (
    "n_mels",
    "n_audio_ctx",
    "n_audio_state",
    "n_audio_head",
    "n_audio_layer",
    "n_vocab",
    "n_text_ctx",
    "n_text_state",
    "n_text_head",
    "n_text_layer",
)


@dataclass(frozen=True)
class WhisperConfig:
    """Shapes of a Whisper encoder-decoder (tiny.en: 80 mels, 1500 audio frames, width 384,
    6 heads, 4 + 4 layers, 51864 tokens, 448 text positions).

    Attributes:
        n_mels: log-mel bins of the input.
        n_audio_ctx: encoder output frames for 30 s of audio (input frames / 2).
        n_audio_state: encoder width.
        n_audio_head: encoder attention heads.
        n_audio_layer: encoder blocks.
        n_vocab: token vocabulary (the output projection's rows).
        n_text_ctx: decoder positions (prompt plus generated tokens).
        n_text_state: decoder width.
        n_text_head: decoder attention heads.
        n_text_layer: decoder blocks.
    """

    n_mels: int = 80
    n_audio_ctx: int = 1500
    n_audio_state: int = 384
    n_audio_head: int = 6
    n_audio_layer: int = 4
    n_vocab: int = 51864
    n_text_ctx: int = 448
    n_text_state: int = 384
    n_text_head: int = 6
    n_text_layer: int = 4

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"WhisperConfig.{name} must be a positive int, got {value!r}")
        for width, heads, side in (
            (self.n_audio_state, self.n_audio_head, "audio"),
            (self.n_text_state, self.n_text_head, "text"),
        ):
            if width % heads:
                raise ValueError(
                    f"WhisperConfig: n_{side}_state ({width}) is not divisible by "
                    f"n_{side}_head ({heads})"
                )

    @property
    def text_head_dim(self) -> int:
        """Per-head dimension of the decoder's K and V."""
        return self.n_text_state // self.n_text_head

    @property
    def n_input_frames(self) -> int:
        """Mel frames of one 30 s window (the encoder's stride-2 conv halves them)."""
        return self.n_audio_ctx * 2


@dataclass(frozen=True)
class DecodingSpec:
    """Special tokens and suppression lists of a checkpoint (its ``config.json``).

    Attributes:
        prompt: the decoder's start prompt (tiny.en: ``<|startoftranscript|><|notimestamps|>``).
        eot: the end-of-transcript token.
        suppress_ids: tokens never generated.
        suppress_ids_begin: tokens not generated at the first step (blank, end-of-transcript).
        no_speech: the no-speech token whose probability at the start token flags silence
            (tiny.en: 50361, ``<|nocaptions|>``); None when the vocabulary has none.
        previous: the token before a previous-text prompt (tiny.en: 50360,
            ``<|startofprev|>``), whose text comes before ``prompt``; None: none.
    """

    prompt: tuple[int, ...] = (50257, 50362)
    eot: int = 50256
    suppress_ids: tuple[int, ...] = ()
    suppress_ids_begin: tuple[int, ...] = (220, 50256)
    no_speech: int | None = None
    previous: int | None = None

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("DecodingSpec.prompt must hold at least the start token")

    @property
    def first_text_token(self) -> int:
        """Tokens below this id are text; the rest are special (tiny.en: eot = 50256)."""
        return self.eot
