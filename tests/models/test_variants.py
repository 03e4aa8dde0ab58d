"""Config variants (batch-norm conv, post-norm, no macaron / no conv): the three streaming
paths agree with the chunk-masked full forward of the same random model."""

from __future__ import annotations

import pytest
import torch
from model_testutil import max_diff, run_forward_chunk, run_paged_alone

from oasr.models import AsrModel, ConformerConfig

VARIANTS = {
    "batch_norm": dict(cnn_module_norm="batch_norm"),
    "post_norm": dict(normalize_before=False),
    "no_macaron_no_conv": dict(macaron_style=False, use_cnn_module=False),
    "relu_no_qkv_bias": dict(activation_type="relu", query_bias=False, key_bias=False),
}


def _model(**overrides) -> AsrModel:
    torch.manual_seed(7)
    cfg = ConformerConfig(output_size=32, attention_heads=4, linear_units=48, num_blocks=2,
                          vocab_size=10, cnn_module_kernel=7, use_dynamic_chunk=True, **overrides)
    model = AsrModel(cfg)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model.eval()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_streaming_paths_agree_with_masked_full_forward(name):
    model = _model(**VARIANTS[name])
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(300, 80, generator=g) * 2.0 + 8.0
    with torch.no_grad():
        full, _ = model.encoder(feats.unsqueeze(0), torch.tensor([300]), 16, 2)
    dense = run_forward_chunk(model, feats, 32)
    paged = run_paged_alone(model, feats, 2)
    assert full.shape[1] == dense.shape[0] == paged.shape[0] == 74
    assert max_diff(dense, full[0]) <= 1e-4
    assert max_diff(paged, full[0]) <= 1e-4
    with torch.no_grad():
        unmasked, _ = model.encoder(feats.unsqueeze(0), torch.tensor([300]), -1, -1)
    assert max_diff(unmasked[0], full[0]) > 1e-3  # the chunk mask mattered
