"""The bundled default model's vocabulary and architecture (recipes/ trains it; the benchmarks
use the architecture with random weights when the checkpoint is absent)."""

from __future__ import annotations

from oasr.models.config import ConformerConfig

# characters a-z, apostrophe and the word boundary, with WeNet's special units
BUNDLED_UNITS = ("<blank>", "<unk>", "'", *(chr(c) for c in range(ord("a"), ord("z") + 1)),
                 "\u2581", "<sos/eos>")


def bundled_architecture() -> ConformerConfig:
    """A small causal Conformer-CTC: cheap enough to serve many streams on a CPU."""
    return ConformerConfig(
        input_dim=80, vocab_size=len(BUNDLED_UNITS), output_size=144, attention_heads=4,
        linear_units=576, num_blocks=6, dropout_rate=0.0, positional_dropout_rate=0.0,
        attention_dropout_rate=0.0, cnn_module_kernel=15, causal=True,
        cnn_module_norm="layer_norm", use_dynamic_chunk=True, use_dynamic_left_chunk=True,
    )
